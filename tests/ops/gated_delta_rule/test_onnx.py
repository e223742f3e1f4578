"""gdn.GatedDeltaRule alone: export contract, schema / shape inference, ORT function vs fp32 reference."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
import torch

from gdn_export.onnx.checks import ExportCheckError, check_plugin_mappable
from gdn_export.onnx.schemas import register_schemas
from gdn_export.ops import gated_delta_rule
from gdn_export.ops.gated_delta_rule import FIELD_SCALE, FIELD_USE_QK_L2NORM, PLUGIN_NAME
from gdn_export.ops.gated_delta_rule.naive import l2norm, recurrent_gated_delta_rule
from gdn_export.ops.gated_delta_rule.onnx import function_proto
from tests.conftest import assert_close_rms, gdn_inputs
from tests.onnx._single_op import (attributes, export_single_op, gdn_nodes, ort_session, output_dims,
                                   run)

ATOL = 1e-5
NAMES = ("q", "k", "v", "g", "beta", "initial_state")


class OneOp(torch.nn.Module):
    def __init__(self, scale, use_qk_l2norm):
        super().__init__()
        self.scale, self.use_qk_l2norm = scale, use_qk_l2norm

    def forward(self, q, k, v, g, beta, initial_state=None):
        return gated_delta_rule(q, k, v, g, beta, initial_state, self.scale, self.use_qk_l2norm)


# (Hk, Hv, Dk, Dv, use_qk_l2norm, scale, with_state, dtype)
CASES = {
    "Hv=2Hk-Dk8-Dv12-l2norm-state": (2, 4, 8, 12, True, None, True, torch.float32),
    "Hv=Hk-Dk16-Dv8-nonorm-scale0.3-no_state": (3, 3, 16, 8, False, 0.3, False, torch.float32),
    "Hv=3Hk-Dk8-Dv8-l2norm-state-fp16": (1, 3, 8, 8, True, None, True, torch.float16),
}
SIZES = [(2, 1), (3, 63), (2, 130)]  # (B, T): T = 1 decode, one chunk - 1, several chunks


def make_inputs(case, B, T, seed=None):
    Hk, Hv, Dk, Dv, use_norm, _, with_state, dtype = case
    x = gdn_inputs(B, T, Hk, Hv, Dk, Dv, dtype=dtype, state=with_state, seed=seed)
    if not use_norm:  # unnormalised keys of norm > sqrt(2) make the recurrence diverge
        x["k"] = (0.9 * l2norm(x["k"].float())).to(dtype)
    return x


@functools.lru_cache(maxsize=None)
def _export(name):
    case = CASES[name]
    _, _, _, _, use_norm, scale, with_state, _ = case
    register_schemas()
    x = make_inputs(case, 2, 3, seed=0)
    names = NAMES if with_state else NAMES[:5]
    args = tuple(x[n] for n in names)
    dyn = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")},) * 5
    if with_state:
        dyn += ({0: torch.export.Dim("batch")},)
    model = export_single_op(OneOp(scale, use_norm), args, dyn, names)
    return case, model, ort_session(model)


@pytest.fixture(params=list(CASES), ids=list(CASES))
def exported(request):
    return _export(request.param)


@pytest.fixture(params=[n for n, c in CASES.items() if c[6]], ids=[n for n, c in CASES.items() if c[6]])
def exported_with_state(request):
    return _export(request.param)


def test_node_is_the_plugin_contract(exported):
    case, model, _ = exported
    Hk, Hv, Dk, Dv, use_norm, scale, _, _ = case
    counts = check_plugin_mappable(model)
    assert counts == {PLUGIN_NAME: 1}
    assert len(model.functions) == 0
    assert {e.domain: e.version for e in model.opset_import}["gdn"] == 1
    (node,) = gdn_nodes(model)
    assert node.op_type == PLUGIN_NAME and len(node.input) == 6 and all(node.input)
    attrs = attributes(node)
    assert attrs.pop("plugin_version") == b"1" and attrs.pop("plugin_namespace") == b"gdn"
    assert attrs == {FIELD_SCALE: pytest.approx(Dk ** -0.5 if scale is None else scale),
                     FIELD_USE_QK_L2NORM: int(use_norm)}
    assert {a.name: a.type for a in node.attribute}[FIELD_SCALE] == onnx.AttributeProto.FLOAT


def test_checker_and_strict_shape_inference(exported):
    case, model, _ = exported
    _, Hv, Dk, Dv, _, _, _, dtype = case
    onnx.checker.check_model(model, full_check=True)
    o, state = output_dims(model)
    assert o == ["batch", "seq", Hv, Dv]
    assert state == ["batch", Hv, Dk, Dv]
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    elem = {o.name: o.type.tensor_type.elem_type for o in inferred.graph.output}
    want = onnx.TensorProto.FLOAT16 if dtype == torch.float16 else onnx.TensorProto.FLOAT
    assert list(elem.values()) == [want, onnx.TensorProto.FLOAT]


@pytest.mark.parametrize("B,T", SIZES, ids=[f"B{b}-T{t}" for b, t in SIZES])
def test_ort_matches_reference(exported, B, T):
    case, _, session = exported
    _, _, _, _, use_norm, scale, _, dtype = case
    x = make_inputs(case, B, T)
    o_ref, s_ref = recurrent_gated_delta_rule(**x, scale=scale, use_qk_l2norm=use_norm)
    o, s = run(session, x)
    assert o.dtype == (np.float16 if dtype == torch.float16 else np.float32)
    assert s.dtype == np.float32 and s.shape == tuple(s_ref.shape)
    if dtype == torch.float32:
        np.testing.assert_allclose(o, o_ref.numpy(), rtol=0, atol=ATOL)
        np.testing.assert_allclose(s, s_ref.numpy(), rtol=0, atol=ATOL)
    else:
        assert_close_rms(torch.from_numpy(o.astype(np.float32)), o_ref.float(), dtype, "o")
        assert_close_rms(torch.from_numpy(s), s_ref, torch.float32, "final_state")


def test_state_carries_across_calls(exported_with_state):
    """Two ORT calls chained through final_state equal one call over the whole sequence."""
    case, _, session = exported_with_state
    x = make_inputs(case, 2, 20)
    first = {k: (v[:, :7] if k != "initial_state" else v) for k, v in x.items()}
    o1, s1 = run(session, first)
    second = {k: v[:, 7:] for k, v in x.items() if k != "initial_state"}
    o2, s2 = run(session, {**second, "initial_state": torch.from_numpy(s1)})
    o_all, s_all = run(session, x)
    tol = ATOL if case[7] == torch.float32 else 1e-2
    np.testing.assert_allclose(np.concatenate([o1, o2], 1).astype(np.float32), o_all.astype(np.float32),
                               rtol=0, atol=tol)
    np.testing.assert_allclose(s2, s_all, rtol=0, atol=ATOL)


def test_opset21_export_and_function():
    """The node and its ORT body also hold at the newest opset TensorRT parses."""
    case = CASES["Hv=2Hk-Dk8-Dv12-l2norm-state"]
    x = make_inputs(case, 2, 3, seed=1)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    dyn = ({0: batch, 1: seq},) * 5 + ({0: batch},)
    model = export_single_op(OneOp(None, True), tuple(x[n] for n in NAMES), dyn, NAMES, opset=21)
    assert {e.domain: e.version for e in model.opset_import} == {"": 21, "gdn": 1}
    assert check_plugin_mappable(model) == {PLUGIN_NAME: 1}
    x = make_inputs(case, 3, 9)
    o, s = run(ort_session(model), x)
    o_ref, s_ref = recurrent_gated_delta_rule(**x, use_qk_l2norm=True)
    np.testing.assert_allclose(o, o_ref.numpy(), rtol=0, atol=ATOL)
    np.testing.assert_allclose(s, s_ref.numpy(), rtol=0, atol=ATOL)


def _node_model(q_shape, v_shape, g_shape=None):
    """A hand-built graph of one gdn.GatedDeltaRule node with the given input shapes."""
    B, T, Hk, Dk = q_shape
    Hv, Dv = v_shape[2], v_shape[3]
    f = onnx.TensorProto.FLOAT
    vi = onnx.helper.make_tensor_value_info
    inputs = [vi("q", f, q_shape), vi("k", f, q_shape), vi("v", f, v_shape),
              vi("g", f, g_shape or [B, T, Hv]), vi("beta", f, [B, T, Hv]), vi("s", f, [B, Hv, Dk, Dv])]
    node = onnx.helper.make_node(PLUGIN_NAME, [i.name for i in inputs], ["o", "final"], domain="gdn",
                                 plugin_version="1", plugin_namespace="gdn", scale=0.5, use_qk_l2norm=1)
    graph = onnx.helper.make_graph([node], "g", inputs, [vi("o", f, None), vi("final", f, None)])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18),
                                                       onnx.helper.make_opsetid("gdn", 1)])


def test_shape_inference_symbolic_dims():
    register_schemas()
    model = _node_model(["B", "T", 2, 8], ["B", "T", 4, 12])
    assert output_dims(model) == [["B", "T", 4, 12], ["B", 4, 8, 12]]


@pytest.mark.parametrize("q_shape,v_shape,g_shape,message", [
    ([1, 5, 3, 8], [1, 5, 4, 12], None, "multiple of key heads"),
    ([1, 5, 2, 8], [1, 5, 4, 12], [1, 5, 4, 1], "g must have rank 3"),
], ids=["Hv=4-not-multiple-of-Hk=3", "g-rank4"])
def test_shape_inference_rejects_bad_shapes(q_shape, v_shape, g_shape, message):
    register_schemas()
    with pytest.raises(Exception, match=message):
        onnx.shape_inference.infer_shapes(_node_model(q_shape, v_shape, g_shape), strict_mode=True)


def test_plugin_check_rejects_a_missing_field():
    register_schemas()
    model = _node_model([1, 5, 2, 8], [1, 5, 4, 12])
    node = model.graph.node[0]
    keep = [a for a in node.attribute if a.name != FIELD_USE_QK_L2NORM]
    del node.attribute[:]
    node.attribute.extend(keep)
    with pytest.raises(ExportCheckError, match="attributes must be"):
        check_plugin_mappable(model)


def test_plugin_check_rejects_local_functions():
    register_schemas()
    model = _node_model([1, 5, 2, 8], [1, 5, 4, 12])
    model.functions.append(function_proto(18))
    with pytest.raises(ExportCheckError, match="no local functions"):
        check_plugin_mappable(model)
