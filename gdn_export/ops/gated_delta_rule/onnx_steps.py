"""ONNX contract of `gdn::gated_delta_rule_steps`: node translation, schema, reference function.

The exported node is what TensorRT's ONNX parser maps to the GatedDeltaRuleSteps plugin
(plugins/gatedDeltaRulePlugin):

    gdn.GatedDeltaRuleSteps(q, k, v, g, beta, initial_state) -> (o, states)
        attributes: plugin_version="1", plugin_namespace="gdn", scale (float), use_qk_l2norm (int)
        o       [B, T, Hv, Dv]      T
        states  [B, T, Hv, Dk, Dv]  S    the state after every token, each rounded to S and the
                                         next token started from the rounded value

Inputs, attributes and dtypes as gdn.GatedDeltaRule (gdn_export.ops.gated_delta_rule.onnx); nothing
is updated in place (the verify step of speculative decoding keeps the state of each row's accepted
prefix, gdn_export.models.verify.roll_back). `function_proto` is gdn.GatedDeltaRule's Loop with
the state rounded through S after every token and kept as a scan output, for ONNX Runtime.
"""

from __future__ import annotations

import onnx
import onnx.parser
from onnx import TensorProto

from gdn_export.ops.gated_delta_rule import (FIELD_SCALE, FIELD_USE_QK_L2NORM, INPUT_NAMES, ONNX_DOMAIN,
                                             PLUGIN_NAMESPACE, PLUGIN_VERSION)
from gdn_export.ops.gated_delta_rule import onnx as one_state
from gdn_export.ops.gated_delta_rule.naive import L2NORM_EPS
from gdn_export.ops.onnx_common import function_text, make_op_schema, plugin_node, register_once, unshape_loop_values
from gdn_export.ops.onnx_common import dim as _dim
from gdn_export.ops.onnx_common import tensor_type as _tensor_type

PLUGIN_NAME = "GatedDeltaRuleSteps"  # must match kGDRS_PLUGIN_NAME (plugins/gatedDeltaRulePlugin)
OUTPUT_NAMES = ("o", "states")
NODE_ATTRIBUTES, NODE_ATTRIBUTE_VALUES = one_state.NODE_ATTRIBUTES, one_state.NODE_ATTRIBUTE_VALUES


def _infer(ctx) -> None:
    """o [B, T, Hv, Dv] in v's type; states [B, T, Hv, Dk, Dv] in initial_state's type."""
    types = [ctx.get_input_type(i) for i in range(len(INPUT_NAMES))]
    if any(t is None for t in types):
        return
    q, _, v, _, _, state = types
    one_state.check_ranks(types, PLUGIN_NAME)
    ctx.set_output_type(0, _tensor_type(v.tensor_type.elem_type, [_dim(v, i) for i in range(4)]))
    state_type = state.tensor_type.elem_type or TensorProto.FLOAT
    ctx.set_output_type(1, _tensor_type(state_type, [_dim(v, 0), _dim(v, 1), _dim(v, 2), _dim(q, 3), _dim(v, 3)]))


def make_schema() -> onnx.defs.OpSchema:
    """The OpSchema of gdn.GatedDeltaRuleSteps (version DOMAIN_VERSION), with shape inference."""
    return make_op_schema(
        PLUGIN_NAME, ONNX_DOMAIN,
        "Gated delta rule over T tokens keeping every token's state (see gdn_export.ops.gated_delta_rule.steps).",
        outputs=[(OUTPUT_NAMES[0], "T", "[B, T, Hv, Dv]"), (OUTPUT_NAMES[1], "S", "[B, T, Hv, Dk, Dv]")],
        infer=_infer, **one_state.schema_parts(),
    )


def register_schema() -> None:
    """Register the schema with the `onnx` package once (checker, shape inference, onnxscript)."""
    register_once(PLUGIN_NAME, ONNX_DOMAIN, make_schema)


def translation(q, k, v, g, beta, initial_state, scale, use_qk_l2norm):
    """onnxscript translation of torch.ops.gdn.gated_delta_rule_steps.default: one
    gdn.GatedDeltaRuleSteps node (a None initial_state becomes fp32 zeros, as gdn.GatedDeltaRule's)."""
    register_schema()
    g, initial_state = one_state.node_state_inputs(q, v, g, initial_state)
    return plugin_node(PLUGIN_NAME, ONNX_DOMAIN, PLUGIN_VERSION, PLUGIN_NAMESPACE,
                       q, k, v, g, beta, initial_state,
                       scale=float(scale), use_qk_l2norm=int(bool(use_qk_l2norm)))


def torch_target():
    """The torch op overload that `translation` translates."""
    import torch

    import gdn_export.ops.gated_delta_rule.steps  # noqa: F401  (registers torch.ops.gdn.gated_delta_rule_steps)

    return torch.ops.gdn.gated_delta_rule_steps.default


# gdn.GatedDeltaRule's Loop, with each token's state rounded through S (CastLike initial_state,
# then back to fp32) before the next token and kept as a scan output; o_t is read from the
# unrounded state, as a one-token call computes it.
_LOOP = """  s_final, o_tm = Loop (trip, go, s0) <body = step (int64 i, bool c_in, float s_in)
                                                => (bool c_out, float s_out, float o_t) {{"""
_STEPS_LOOP = """  s_final, o_tm, st_tm = Loop (trip, go, s0) <body = step (int64 i, bool c_in, float s_in)
                                                => (bool c_out, float s_next, float o_t, float s_kept) {{"""
_BODY_END = """    o_t = Squeeze (o_row, ax2)
"""
_STEPS_BODY_END = """    o_t = Squeeze (o_row, ax2)
    s_stored = CastLike (s_out, initial_state)
    s_next = Cast <to = 1> (s_stored)
    s_kept = Identity (s_next)
"""
_TAIL = """  {state} = CastLike (s_final, initial_state)
"""
_STEPS_TAIL = """  st_f = Transpose <perm = [1, 0, 2, 3, 4]> (st_tm)
  {state} = CastLike (st_f, initial_state)
"""


def _steps_template() -> str:
    text = one_state.FUNCTION_TEXT
    for old, new in ((_LOOP, _STEPS_LOOP), (_BODY_END, _STEPS_BODY_END), (_TAIL, _STEPS_TAIL)):
        if text.count(old) != 1:
            raise AssertionError(f"gdn.GatedDeltaRule's function text changed: {old.strip()[:40]!r} not found once")
        text = text.replace(old, new)
    return text


def function_proto(opset: int) -> onnx.FunctionProto:
    """gdn.GatedDeltaRuleSteps in standard ONNX (default domain version `opset`), for ONNX Runtime."""
    text = function_text(
        _steps_template(), domain=ONNX_DOMAIN, opset=opset, name=PLUGIN_NAME,
        fields=(FIELD_SCALE, FIELD_USE_QK_L2NORM), inputs=INPUT_NAMES, outputs=OUTPUT_NAMES,
        o=OUTPUT_NAMES[0], state=OUTPUT_NAMES[1],
        l2attr=FIELD_USE_QK_L2NORM, scaleattr=FIELD_SCALE, eps=repr(L2NORM_EPS),
    )
    return unshape_loop_values(onnx.parser.parse_function(text), keep={"i", "c_in", "c_out"})
