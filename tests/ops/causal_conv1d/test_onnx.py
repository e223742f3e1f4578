"""gdn.CausalConv1d alone: export contract, schema / shape inference, ORT function vs fp32 reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from gdn_export.onnx.checks import check_plugin_mappable
from gdn_export.onnx.schemas import register_schemas
from gdn_export.ops import causal_conv1d
from gdn_export.ops.causal_conv1d import (ACTIVATION_NONE, ACTIVATION_SILU, FIELD_ACTIVATION,
                                          PLUGIN_NAME)
from gdn_export.ops.causal_conv1d.naive import causal_conv1d as reference
from tests.conftest import assert_close_rms
from tests.onnx._single_op import (attributes, export_single_op, gdn_nodes, ort_session, output_dims,
                                   run)

ATOL = 1e-5


class OneOp(torch.nn.Module):
    """The conv with its weight / bias as parameters (as in the model: initializers in ONNX)."""

    def __init__(self, C, K, bias, silu, dtype):
        super().__init__()
        gen = torch.Generator().manual_seed(C * 100 + K)
        self.weight = torch.nn.Parameter((0.3 * torch.randn(C, K, generator=gen)).to(dtype))
        self.bias = torch.nn.Parameter(torch.randn(C, generator=gen).to(dtype)) if bias else None
        self.silu = silu

    def forward(self, x, conv_state=None, seq_lens=None):
        return causal_conv1d(x, self.weight, self.bias, conv_state, self.silu, seq_lens=seq_lens)


# (C, K, bias, silu, with_state, dtype, ragged)
CASES = {
    "C10-K4-bias-silu-state": (10, 4, True, True, True, torch.float32, False),
    "C7-K3-nobias-noact-no_state": (7, 3, False, False, False, torch.float32, False),
    "C6-K2-bias-silu-state-fp16": (6, 2, True, True, True, torch.float16, False),
    "C9-K4-bias-silu-state-ragged": (9, 4, True, True, True, torch.float32, True),
    "C5-K3-nobias-noact-ragged-fp16": (5, 3, False, False, True, torch.float16, True),
}
SIZES = [(2, 1), (3, 2), (2, 63), (1, 130), (4, 65)]  # T < K-1 keeps part of the old state


def ragged_lengths(B, T):
    """Row lengths with the ends of the range in it: T, 0, then random (int32)."""
    lens = torch.randint(0, T + 1, (B,), dtype=torch.int32)
    lens[0] = T
    if B > 1:
        lens[1] = 0
    return lens


def make_inputs(case, B, T):
    C, K, _, _, with_state, dtype, ragged = case
    x = {"x": torch.randn(B, T, C).to(dtype)}
    if with_state:
        x["conv_state"] = torch.randn(B, C, K - 1).to(dtype)
    if ragged:
        x["seq_lens"] = ragged_lengths(B, T)
    return x


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def exported(request):
    case = CASES[request.param]
    C, K, bias, silu, with_state, dtype, ragged = case
    register_schemas()
    module = OneOp(C, K, bias, silu, dtype)
    x = make_inputs(case, 2, 3)
    names = list(x)
    dyn = [{0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}]
    if with_state:
        dyn.append({0: torch.export.Dim("batch")})
    if ragged:
        dyn.append({0: torch.export.Dim("batch")})
    model = export_single_op(module, tuple(x.values()), tuple(dyn), names)
    return case, module, model, ort_session(model)


def test_node_is_the_plugin_contract(exported):
    case, _, model, _ = exported
    silu = case[3]
    assert check_plugin_mappable(model) == {PLUGIN_NAME: 1}
    assert len(model.functions) == 0
    (node,) = gdn_nodes(model)
    assert len(node.input) == 5 and all(node.input)
    attrs = attributes(node)
    assert attrs == {"plugin_version": b"1", "plugin_namespace": b"gdn",
                     FIELD_ACTIVATION: ACTIVATION_SILU if silu else ACTIVATION_NONE}


def test_checker_and_strict_shape_inference(exported):
    case, _, model, _ = exported
    C, K = case[:2]
    onnx.checker.check_model(model, full_check=True)
    assert output_dims(model) == [["batch", "seq", C], ["batch", C, K - 1]]


@pytest.mark.parametrize("B,T", SIZES, ids=[f"B{b}-T{t}" for b, t in SIZES])
def test_ort_matches_reference(exported, B, T):
    case, module, _, session = exported
    dtype = case[5]
    x = make_inputs(case, B, T)
    y_ref, s_ref = reference(x["x"], module.weight.detach(),
                             None if module.bias is None else module.bias.detach(),
                             x.get("conv_state"), module.silu, x.get("seq_lens"))
    y, s = run(session, x)
    if "seq_lens" in x:
        # y at padded positions is unspecified (but finite): compare the real tokens only
        assert np.isfinite(np.asarray(y, dtype=np.float32)).all()
        valid = (torch.arange(T)[None, :] < x["seq_lens"][:, None].long())[..., None].numpy()
        y = np.where(valid, y, 0)
        y_ref = y_ref.masked_fill(~torch.from_numpy(valid), 0)
    if dtype == torch.float32:
        np.testing.assert_allclose(y, y_ref.numpy(), rtol=0, atol=ATOL)
    else:
        assert y.dtype == np.float16
        assert_close_rms(torch.from_numpy(y.astype(np.float32)), y_ref.float(), dtype, "y")
    # the new state is a copy of inputs: exact in every dtype
    np.testing.assert_array_equal(s, s_ref.numpy())


def test_opset21_export_and_function():
    case = CASES["C10-K4-bias-silu-state"]
    module = OneOp(*case[:4], case[5])
    x = make_inputs(case, 2, 3)
    dyn = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}, {0: torch.export.Dim("batch")})
    model = export_single_op(module, tuple(x.values()), dyn, list(x), opset=21)
    assert {e.domain: e.version for e in model.opset_import} == {"": 21, "gdn": 1}
    assert check_plugin_mappable(model) == {PLUGIN_NAME: 1}
    x = make_inputs(case, 3, 9)
    y, s = run(ort_session(model), x)
    y_ref, s_ref = reference(x["x"], module.weight.detach(), module.bias.detach(), x["conv_state"], True)
    np.testing.assert_allclose(y, y_ref.numpy(), rtol=0, atol=ATOL)
    np.testing.assert_array_equal(s, s_ref.numpy())


def test_shape_inference_rejects_mismatched_weight():
    register_schemas()
    f = onnx.TensorProto.FLOAT
    vi = onnx.helper.make_tensor_value_info
    inputs = [vi("x", f, ["B", "T", 8]), vi("w", f, [6, 4]), vi("b", f, [8]), vi("s", f, ["B", 8, 3]),
              vi("L", onnx.TensorProto.INT32, ["B"])]
    node = onnx.helper.make_node(PLUGIN_NAME, ["x", "w", "b", "s", "L"], ["y", "ns"], domain="gdn",
                                 plugin_version="1", plugin_namespace="gdn", activation=1)
    graph = onnx.helper.make_graph([node], "g", inputs, [vi("y", f, None), vi("ns", f, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18),
                                                        onnx.helper.make_opsetid("gdn", 1)])
    with pytest.raises(Exception, match="weight must be"):
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
