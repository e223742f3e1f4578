"""gdn.GatedDeltaRule with a 16-bit recurrent state: the node keeps the state's dtype (type
constraint S), shape inference follows it, and the ORT function body (fp32 inside, one cast back
at the end) matches the reference that rounds at the same place. ORT's CPU provider has no bf16
arithmetic: fp16 states run numerically, bf16 states are checked structurally."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
import torch

from gdn_export.onnx.checks import check_plugin_mappable
from gdn_export.onnx.schemas import register_schemas
from gdn_export.ops import gated_delta_rule
from gdn_export.ops.gated_delta_rule import PLUGIN_NAME
from gdn_export.ops.gated_delta_rule.naive import recurrent_gated_delta_rule
from tests.conftest import gdn_inputs, rel_rms
from tests.onnx._single_op import export_gdr_op, gdn_nodes, output_dims, ort_session, run

ELEM = {torch.float32: onnx.TensorProto.FLOAT, torch.float16: onnx.TensorProto.FLOAT16,
        torch.bfloat16: onnx.TensorProto.BFLOAT16}


class OneOp(torch.nn.Module):
    def forward(self, q, k, v, g, beta, initial_state):
        return gated_delta_rule(q, k, v, g, beta, initial_state, None, True)


def _inputs(B, T, dtype, state_dtype, seed=None):
    x = gdn_inputs(B, T, 1, 2, 8, 12, dtype=dtype, seed=seed)
    x["initial_state"] = x["initial_state"].to(state_dtype)
    return x


@functools.lru_cache(maxsize=None)
def _export(dtype, state_dtype):
    register_schemas()
    return export_gdr_op(OneOp(), _inputs(2, 3, dtype, state_dtype, seed=0))


CASES = [pytest.param(torch.float32, torch.float16, id="fp32-act-fp16-state"),
         pytest.param(torch.float16, torch.float16, id="fp16-act-fp16-state"),
         pytest.param(torch.float32, torch.bfloat16, id="fp32-act-bf16-state"),
         pytest.param(torch.bfloat16, torch.bfloat16, id="bf16-act-bf16-state"),
         pytest.param(torch.bfloat16, torch.float32, id="bf16-act-fp32-state")]


@pytest.mark.parametrize("dtype,state_dtype", CASES)
def test_node_keeps_the_state_dtype(dtype, state_dtype):
    model = _export(dtype, state_dtype)
    assert check_plugin_mappable(model) == {PLUGIN_NAME: 1}
    (node,) = gdn_nodes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in list(model.graph.input) + list(model.graph.output)}
    # the state goes straight into the node: no Cast between the graph input and the plugin
    assert node.input[5] == "initial_state" and types["initial_state"] == ELEM[state_dtype]
    assert types[model.graph.output[1].name] == ELEM[state_dtype]
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    assert inferred.graph.output[1].type.tensor_type.elem_type == ELEM[state_dtype]
    assert output_dims(model)[1][1:] == [2, 8, 12]


@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, id="fp32-act"), pytest.param(torch.float16, id="fp16-act")])
@pytest.mark.parametrize("B,T", [(2, 1), (3, 63), (2, 130)], ids=lambda x: str(x))
def test_ort_fp16_state_matches_reference(B, T, dtype):
    session = ort_session(_export(dtype, torch.float16))
    x = _inputs(B, T, dtype, torch.float16)
    o, s = run(session, x)
    o_ref, s_ref = recurrent_gated_delta_rule(**x, use_qk_l2norm=True)
    assert s.dtype == np.float16 and s_ref.dtype == torch.float16
    # fp32 inside: o as close as with an fp32 state; the state within one fp16 rounding
    assert rel_rms(torch.from_numpy(o.astype(np.float32)), o_ref.float()) <= (1e-5 if dtype == torch.float32 else 1e-2)
    assert rel_rms(torch.from_numpy(s), s_ref) <= 5e-4
    # and it is rounded only once: decoding the same tokens one step at a time rounds T times
    # and lands measurably elsewhere than one T-token call (which the two sides agree on)
    if T > 1:
        s_steps = x["initial_state"]
        for t in range(T):
            step = {n: val[:, t : t + 1] for n, val in x.items() if n != "initial_state"}
            _, s_steps = run(session, {**step, "initial_state": torch.from_numpy(np.asarray(s_steps))})
        assert rel_rms(torch.from_numpy(s_steps), s_ref) > rel_rms(torch.from_numpy(s), s_ref)


def test_function_casts_the_state_at_the_ends_only():
    from gdn_export.ops.gated_delta_rule.onnx import function_proto

    fn = function_proto(18)
    casts = [n for n in fn.node if n.op_type in ("Cast", "CastLike") and "initial_state" in n.input]
    assert [n.op_type for n in casts] == ["Cast", "CastLike"]
    assert fn.node[-1].op_type == "CastLike" and list(fn.node[-1].input) == ["s_final", "initial_state"]
