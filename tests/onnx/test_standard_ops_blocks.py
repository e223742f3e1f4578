"""One gdn node rewritten to its standard block (gdn_export.onnx.standard_ops), run on ONNX Runtime's
com.microsoft kernels and on the gdn function bodies, against the fp32 references: odd T, Hv = 2 Hk,
Dk != Dv, ragged rows, beta in (0, 2), fp16 activations and fp16 / fp32 states."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from gdn_export.errors import GdnExportError
from gdn_export.onnx import ort_native, standard_ops
from gdn_export.onnx.schemas import register_schemas
from gdn_export.ops.causal_conv1d import INPUT_NAMES as CONV_IN, OUTPUT_NAMES as CONV_OUT
from gdn_export.ops.causal_conv1d.naive import causal_conv1d
from gdn_export.ops.gated_delta_rule import INPUT_NAMES as GDR_IN, OUTPUT_NAMES as GDR_OUT
from gdn_export.ops.gated_delta_rule.naive import recurrent_gated_delta_rule
from tests.conftest import gdn_inputs
from tests.onnx._same import assert_same_graph
from tests.ragged import conv_ragged_inputs, gdr_padded_inputs, with_beta_up_to_2

F32, F16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
NP = {F32: np.float32, F16: np.float16}
TORCH = {F32: torch.float32, F16: torch.float16}


def _model(node, inputs, outputs, opset=24):
    register_schemas()
    graph = onnx.helper.make_graph([node], "one_op", inputs, outputs)
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset),
                                                        onnx.helper.make_opsetid("gdn", 1)])


def gdr_model(Hk, Hv, Dk, Dv, act=F32, state=F32, l2=1, scale=None):
    vi = onnx.helper.make_tensor_value_info
    shapes = {"q": ["B", "T", Hk, Dk], "k": ["B", "T", Hk, Dk], "v": ["B", "T", Hv, Dv],
              "g": ["B", "T", Hv], "beta": ["B", "T", Hv], "initial_state": ["B", Hv, Dk, Dv]}
    types = {"g": F32, "initial_state": state}
    node = onnx.helper.make_node("GatedDeltaRule", list(GDR_IN), list(GDR_OUT), domain="gdn", name="gdr",
                                 plugin_version="1", plugin_namespace="gdn",
                                 scale=scale or Dk ** -0.5, use_qk_l2norm=l2)
    return _model(node, [vi(n, types.get(n, act), shapes[n]) for n in GDR_IN],
                  [vi("o", act, ["B", "T", Hv, Dv]), vi("final_state", state, ["B", Hv, Dk, Dv])])


def conv_model(C, K, act=F32, silu=1):
    vi = onnx.helper.make_tensor_value_info
    shapes = {"x": ["B", "T", C], "weight": [C, K], "bias": [C], "conv_state": ["B", C, K - 1],
              "seq_lens": ["B"]}
    node = onnx.helper.make_node("CausalConv1d", list(CONV_IN), list(CONV_OUT), domain="gdn", name="conv",
                                 plugin_version="1", plugin_namespace="gdn", activation=silu)
    return _model(node, [vi(n, onnx.TensorProto.INT32 if n == "seq_lens" else act, shapes[n]) for n in CONV_IN],
                  [vi("y", act, ["B", "T", C]), vi("new_conv_state", act, ["B", C, K - 1])])


def _session(model, kernels):
    plan = ort_native.prepare(model, kernels)
    assert plan.kernels == kernels, plan.note
    if kernels == "native":
        ops = {(n.domain, n.op_type) for n in plan.model.graph.node}
        assert ("gdn", "GatedDeltaRule") not in ops and ("gdn", "CausalConv1d") not in ops
    return ort.InferenceSession(plan.model.SerializeToString(), providers=["CPUExecutionProvider"])


def _run(session, feeds):
    names = {i.name for i in session.get_inputs()}
    return [torch.from_numpy(np.asarray(o)) for o in
            session.run(None, {k: v.numpy() for k, v in feeds.items() if k in names})]


KERNELS = ["native", "functions"]
GDR_CASES = {  # id -> (B, T, Hk, Hv, Dk, Dv)
    "T1-decode": (3, 1, 2, 4, 16, 24),
    "T63-Hv2Hk": (2, 63, 1, 2, 16, 32),
    "T65-Hv=Hk": (1, 65, 2, 2, 32, 16),
    "T130-Hv3Hk": (2, 130, 1, 3, 8, 12),
}


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("case", GDR_CASES, ids=list(GDR_CASES))
@pytest.mark.parametrize("correlated", [False, True], ids=["random", "model-like"])
def test_gated_delta_rule_block_matches_reference(kernels, case, correlated):
    B, T, Hk, Hv, Dk, Dv = GDR_CASES[case]
    x = gdn_inputs(B, T, Hk, Hv, Dk, Dv, seed=T, correlated=correlated)
    o, s = _run(_session(gdr_model(Hk, Hv, Dk, Dv), kernels), x)
    want_o, want_s = recurrent_gated_delta_rule(**x, scale=Dk ** -0.5, use_qk_l2norm=True)
    torch.testing.assert_close(o, want_o, rtol=1e-4, atol=2e-5)
    torch.testing.assert_close(s, want_s, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("l2", [0, 1], ids=["no-l2norm", "l2norm"])
def test_gated_delta_rule_block_scale_and_l2norm_flag(l2):
    B, T, Hk, Hv, Dk, Dv = 2, 9, 1, 2, 8, 8
    x = with_beta_up_to_2(gdn_inputs(B, T, Hk, Hv, Dk, Dv, seed=1))
    if not l2:  # unnormalised keys with beta up to 2 diverge: keep them small
        x = {**x, "k": x["k"] * 0.25}
    o, s = _run(_session(gdr_model(Hk, Hv, Dk, Dv, l2=l2, scale=0.7), "native"), x)
    want_o, want_s = recurrent_gated_delta_rule(**x, scale=0.7, use_qk_l2norm=bool(l2))
    torch.testing.assert_close(o, want_o, rtol=1e-4, atol=2e-5)
    torch.testing.assert_close(s, want_s, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("kernels", KERNELS)
def test_gated_delta_rule_block_padded_rows_equal_rows_alone(kernels):
    lengths, T = (1, 63, 130, 0), 130
    x = gdr_padded_inputs(lengths, T, 1, 2, 16, 24, torch.float32, "cpu")
    o, s = _run(_session(gdr_model(1, 2, 16, 24), kernels), x)
    for b, L in enumerate(lengths):
        row = {n: x[n][b:b + 1, :L] for n in ("q", "k", "v", "g", "beta")}
        s0 = x["initial_state"][b:b + 1]
        if L == 0:
            torch.testing.assert_close(s[b:b + 1], s0, rtol=0, atol=0)
            continue
        want_o, want_s = recurrent_gated_delta_rule(**row, initial_state=s0, scale=16 ** -0.5,
                                                    use_qk_l2norm=True)
        torch.testing.assert_close(o[b:b + 1, :L], want_o, rtol=1e-4, atol=2e-5)
        torch.testing.assert_close(s[b:b + 1], want_s, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("act,state", [(F16, F32), (F16, F16), (F32, F16)],
                         ids=["fp16-act-fp32-state", "fp16-act-fp16-state", "fp32-act-fp16-state"])
def test_gated_delta_rule_block_dtypes_round_where_the_gdn_op_rounds(act, state):
    """Native block and function body compute in fp32 and round o / the state once: they agree to
    one unit of the storage dtype, and both agree with the fp32 reference within its rounding."""
    B, T, Hk, Hv, Dk, Dv = 2, 33, 1, 2, 16, 24
    x = gdn_inputs(B, T, Hk, Hv, Dk, Dv, seed=5)
    x = {n: (t.to(TORCH[state]) if n == "initial_state" else t if n == "g" else t.to(TORCH[act]))
         for n, t in x.items()}
    model = gdr_model(Hk, Hv, Dk, Dv, act=act, state=state)
    native, body = (_run(_session(model, k), x) for k in KERNELS)
    assert native[0].dtype == TORCH[act] and native[1].dtype == TORCH[state]
    ref = recurrent_gated_delta_rule(**{n: t.float() for n, t in x.items()}, scale=Dk ** -0.5,
                                     use_qk_l2norm=True)
    for got, other, want, dtype in zip(native, body, ref, (act, state)):
        tol = 2e-3 if dtype == F16 else 1e-4
        torch.testing.assert_close(got.float(), other.float(), rtol=tol, atol=tol)
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


CONV_CASES = {  # id -> (T, lengths)
    "T1-decode-some-empty": (1, [1, 0, 1]),
    "T2-shorter-than-state": (2, [2, 1, 0]),
    "T63-mixed": (63, [63, 0, 17, 1]),
    "T130-mixed": (130, [1, 63, 130]),
}


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("case", CONV_CASES, ids=list(CONV_CASES))
@pytest.mark.parametrize("silu", [1, 0], ids=["silu", "none"])
def test_conv_block_ragged_rows_match_reference(kernels, case, silu):
    T, lengths = CONV_CASES[case]
    C, K = 40, 4
    x, w, b, s0, lens = conv_ragged_inputs(lengths, T, C, K, torch.float32, "cpu", seed=T)
    feeds = dict(x=x, weight=w, bias=b, conv_state=s0, seq_lens=lens)
    y, s = _run(_session(conv_model(C, K, silu=silu), kernels), feeds)
    for i, L in enumerate(lengths):
        if L == 0:
            assert torch.equal(s[i], s0[i])
            continue
        want_y, want_s = causal_conv1d(x[i:i + 1, :L], w, b, s0[i:i + 1], bool(silu))
        torch.testing.assert_close(y[i:i + 1, :L], want_y, rtol=1e-5, atol=1e-5)
        assert torch.equal(s[i:i + 1], want_s), f"state of row {i} (L={L}) must be a copy of its inputs"


def test_conv_block_fp16_state_is_an_exact_copy():
    lengths, T, C, K = [5, 0, 2], 5, 16, 4
    x, w, b, s0, lens = conv_ragged_inputs(lengths, T, C, K, torch.float16, "cpu")
    feeds = dict(x=x, weight=w, bias=b, conv_state=s0, seq_lens=lens)
    native, body = (_run(_session(conv_model(C, K, act=F16), k), feeds) for k in KERNELS)
    assert torch.equal(native[1], body[1])
    torch.testing.assert_close(native[0], body[0], rtol=1e-3, atol=1e-3)


# ------------------------------------------------------------------- rewrites and their records


def test_to_gdn_undoes_to_standard_exactly():
    for model in (gdr_model(1, 2, 16, 24), conv_model(8, 4)):
        std = standard_ops.to_standard(model)
        assert {e.domain: e.version for e in std.opset_import} == {"": 27}
        assert standard_ops.form_of(std) == "standard" and standard_ops.form_of(model) == "gdn"
        onnx.checker.check_model(std, full_check=True)
        back = standard_ops.to_gdn(std, opset=24)
        assert_same_graph(back.graph, model.graph)
        assert {e.domain: e.version for e in back.opset_import} == {"": 24, "gdn": 1}


def test_to_gdn_refuses_a_block_without_its_record():
    std = standard_ops.to_standard(gdr_model(1, 2, 16, 24))
    for node in std.graph.node:
        if node.op_type == "LinearAttention":
            keep = [p for p in node.metadata_props if p.key != standard_ops.KEY_GDN_NODE]
            del node.metadata_props[:]
            node.metadata_props.extend(keep)
    with pytest.raises(GdnExportError, match="no gdn_export.gdn_node record"):
        standard_ops.to_gdn(std)


def test_unknown_head_counts_are_refused_by_name():
    model = gdr_model(1, 2, 16, 24)
    model.graph.input[0].type.tensor_type.ClearField("shape")  # q of unknown shape
    with pytest.raises(GdnExportError, match="shape of 'q' is unknown"):
        standard_ops.to_standard(model)
    plan = ort_native.prepare(model, "auto")  # auto falls back and says why
    assert plan.kernels == "functions" and "shape of 'q' is unknown" in plan.note
    with pytest.raises(GdnExportError, match="native"):
        ort_native.prepare(model, "native")


def test_missing_kernels_fall_back_with_the_reason(monkeypatch):
    monkeypatch.setattr(ort_native, "missing_native_kernels", lambda provider: ["LinearAttention"])
    plan = ort_native.prepare(gdr_model(1, 2, 16, 24), "auto")
    assert plan.kernels == "functions" and "no CPUExecutionProvider kernel for com.microsoft.LinearAttention" in plan.note
