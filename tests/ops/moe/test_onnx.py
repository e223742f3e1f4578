"""gdn.MoE alone: export contract, schema / shape inference, ORT function vs the fp32 reference,
and a check that the ORT body's cost follows top-k (it reads only the routed experts)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from gdn_export.onnx.checks import check_plugin_mappable
from gdn_export.onnx.schemas import register_schemas
from gdn_export.ops import moe
from gdn_export.ops.moe import FIELD_NORM_TOPK_PROB, FIELD_TOP_K, PLUGIN_NAME
from gdn_export.ops.moe.naive import moe as reference
from tests.conftest import assert_close_rms
from tests.onnx._single_op import (attributes, export_single_op, gdn_nodes, ort_session, output_dims,
                                   run)
from tests.ops.moe.inputs import moe_inputs

ATOL = 1e-5


class OneOp(torch.nn.Module):
    """The op with its expert weights as parameters (initializers in ONNX)."""

    def __init__(self, H, E, I, top_k, norm, dtype):
        super().__init__()
        _, _, gate_up, down = moe_inputs(1, H, E, I, dtype, seed=H * 100 + E)
        self.gate_up, self.down = torch.nn.Parameter(gate_up), torch.nn.Parameter(down)
        self.top_k, self.norm = top_k, norm

    def forward(self, hidden, router_logits):
        return moe(hidden, router_logits, self.gate_up, self.down, self.top_k, self.norm)


CASES = {  # (H, E, I, top_k, norm, dtype)
    "H16-E8-I6-k2": (16, 8, 6, 2, True, torch.float32),
    "H12-E5-I7-k1-nonorm": (12, 5, 7, 1, False, torch.float32),
    "H16-E16-I8-k4-fp16": (16, 16, 8, 4, True, torch.float16),
}
SIZES = [1, 7, 65]


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def exported(request):
    case = CASES[request.param]
    H, E, I, k, norm, dtype = case
    register_schemas()
    module = OneOp(*case)
    hidden, logits, _, _ = moe_inputs(3, H, E, I, dtype)
    dyn = ({0: torch.export.Dim("tokens")}, {0: torch.export.Dim("tokens")})
    model = export_single_op(module, (hidden, logits), dyn, ["hidden", "router_logits"])
    return case, module, model, ort_session(model)


def test_node_is_the_plugin_contract(exported):
    case, _, model, _ = exported
    assert check_plugin_mappable(model) == {PLUGIN_NAME: 1}
    (node,) = gdn_nodes(model)
    assert len(node.input) == 4 and all(node.input)
    assert attributes(node) == {"plugin_version": b"1", "plugin_namespace": b"gdn",
                                FIELD_TOP_K: case[3], FIELD_NORM_TOPK_PROB: int(case[4])}


def test_checker_and_strict_shape_inference(exported):
    case, _, model, _ = exported
    onnx.checker.check_model(model, full_check=True)
    assert output_dims(model) == [["tokens", case[0]]]


@pytest.mark.parametrize("N", SIZES, ids=[f"N{n}" for n in SIZES])
def test_ort_matches_reference(exported, N):
    case, module, _, session = exported
    H, E, I, k, norm, dtype = case
    hidden, logits, _, _ = moe_inputs(N, H, E, I, dtype, seed=N)
    expected = reference(hidden, logits, module.gate_up.detach(), module.down.detach(), k, norm)
    (out,) = run(session, {"hidden": hidden, "router_logits": logits})
    if dtype == torch.float32:
        np.testing.assert_allclose(out, expected.numpy(), rtol=0, atol=ATOL)
    else:
        assert out.dtype == np.float16
        assert_close_rms(torch.from_numpy(out.astype(np.float32)), expected.float(), dtype, "out")


def test_ort_body_reads_only_routed_experts():
    """Experts nobody picks hold NaN: a body that touched them (dense or masked) would return NaN."""
    H, E, I = 8, 6, 4
    module = OneOp(H, E, I, 2, True, torch.float32)
    with torch.no_grad():
        module.gate_up[3:] = float("nan")
        module.down[3:] = float("nan")
    hidden, logits, _, _ = moe_inputs(5, H, E, I)
    logits[:, 3:] = -30.0  # experts 3.. are never in the top 2
    dyn = ({0: torch.export.Dim("tokens")}, {0: torch.export.Dim("tokens")})
    model = export_single_op(module, (hidden, logits), dyn, ["hidden", "router_logits"])
    (out,) = run(ort_session(model), {"hidden": hidden, "router_logits": logits})
    assert np.isfinite(out).all()
    expected = reference(hidden, logits, module.gate_up.detach(), module.down.detach(), 2, True)
    np.testing.assert_allclose(out, expected.numpy(), rtol=0, atol=ATOL)


def _node_model(shapes, top_k=2):
    f = onnx.TensorProto.FLOAT
    vi = onnx.helper.make_tensor_value_info
    names = ["hidden", "router_logits", "gate_up", "down"]
    node = onnx.helper.make_node(PLUGIN_NAME, names, ["out"], domain="gdn", plugin_version="1",
                                 plugin_namespace="gdn", top_k=top_k, norm_topk_prob=1)
    graph = onnx.helper.make_graph([node], "g", [vi(n, f, s) for n, s in zip(names, shapes)],
                                   [vi("out", f, None)])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18),
                                                        onnx.helper.make_opsetid("gdn", 1)])


SHAPE_ERRORS = {
    "E": ((["N", 8], ["N", 4], [5, 12, 8], [5, 8, 6]), "router_logits E vs gate_up"),
    "H": ((["N", 8], ["N", 4], [4, 12, 8], [4, 9, 6]), "hidden H vs down"),
    "I": ((["N", 8], ["N", 4], [4, 12, 8], [4, 8, 5]), "gate_up must be"),
    "rank": ((["N", 8], ["N", 4], [4, 12, 8, 1], [4, 8, 6]), "gate_up must have rank 3"),
}


@pytest.mark.parametrize("shapes,message", list(SHAPE_ERRORS.values()), ids=list(SHAPE_ERRORS))
def test_shape_inference_rejects_mismatches(shapes, message):
    register_schemas()
    with pytest.raises(Exception, match=message):
        onnx.shape_inference.infer_shapes(_node_model(shapes), strict_mode=True)


def test_shape_inference_output():
    register_schemas()
    model = _node_model((["N", 8], ["N", 4], [4, 12, 8], [4, 8, 6]))
    assert output_dims(model) == [["N", 8]]
