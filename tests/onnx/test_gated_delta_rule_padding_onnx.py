"""The ORT function body of gdn.GatedDeltaRule on right-padded batches (g = beta = 0 past each row's
end) and with beta in (0, 2), against the fp32 reference (see tests/ops/test_gated_delta_rule_padding.py)."""

from __future__ import annotations

import onnx
import pytest
import torch

from gdn_export.onnx.schemas import register_schemas
from gdn_export.ops.gated_delta_rule import INPUT_NAMES, OUTPUT_NAMES, PLUGIN_NAME
from gdn_export.ops.gated_delta_rule.naive import recurrent_gated_delta_rule
from tests.conftest import assert_close_rms, gdn_inputs
from tests.onnx._single_op import ort_session, run
from tests.ragged import GDR_PADDED, check_gdr_rows, gdr_padded_inputs, with_beta_up_to_2


def _session(Dk):
    """One gdn.GatedDeltaRule node (fp32, every dim symbolic but the head sizes) through ORT."""
    register_schemas()
    f = onnx.TensorProto.FLOAT
    vi = onnx.helper.make_tensor_value_info
    shapes = {"q": ["B", "T", "Hk", Dk], "k": ["B", "T", "Hk", Dk], "v": ["B", "T", "Hv", "Dv"],
              "g": ["B", "T", "Hv"], "beta": ["B", "T", "Hv"], "initial_state": ["B", "Hv", Dk, "Dv"]}
    inputs = [vi(n, f, shapes[n]) for n in INPUT_NAMES]
    node = onnx.helper.make_node(PLUGIN_NAME, list(INPUT_NAMES), list(OUTPUT_NAMES), domain="gdn",
                                 plugin_version="1", plugin_namespace="gdn", scale=Dk ** -0.5, use_qk_l2norm=1)
    graph = onnx.helper.make_graph([node], "g", inputs, [vi(n, f, None) for n in OUTPUT_NAMES])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18),
                                                        onnx.helper.make_opsetid("gdn", 1)])
    return ort_session(model)


@pytest.mark.parametrize("correlated", [False, True], ids=["random", "model-like"])
def test_right_padding_equals_each_row_alone(correlated):
    p = GDR_PADDED
    x = gdr_padded_inputs(p["lengths"], p["T"], p["Hk"], p["Hv"], p["Dk"], p["Dv"], torch.float32, "cpu",
                          correlated=correlated)
    o, s = run(_session(p["Dk"]), x)
    check_gdr_rows(torch.from_numpy(o), torch.from_numpy(s), x, p["lengths"], torch.float32,
                   recurrent_gated_delta_rule)


@pytest.mark.parametrize("correlated", [False, True], ids=["random", "model-like"])
@pytest.mark.parametrize("T", [1, 65], ids=lambda t: f"T{t}")
def test_beta_up_to_2(T, correlated):
    x = with_beta_up_to_2(gdn_inputs(2, T, 1, 2, 16, 32, seed=T, correlated=correlated))
    o, s = run(_session(16), x)
    ro, rs = recurrent_gated_delta_rule(**x, scale=16 ** -0.5, use_qk_l2norm=True)
    assert_close_rms(torch.from_numpy(o), ro, torch.float32, "o")
    assert_close_rms(torch.from_numpy(s), rs, torch.float32, "final_state")
