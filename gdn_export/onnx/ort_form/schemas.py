"""OpSchemas of the com.microsoft contrib ops the ort form uses, registered with the `onnx` package
so that onnx.checker (full_check), strict shape inference and gdn_export.onnx.bf16 read our ort-form
files. Inputs, outputs, types and attributes are those ONNX Runtime 1.32 declares (its
`get_all_operator_schema()`); ONNX Runtime keeps its own registry and ignores these. Shape
inference covers the spellings the ort form writes: GatedDeltaNet's rank-4 q / k / v with the
state given, VarlenCausalConvWithState and GatedRMSNorm (output shaped as the input).
"""

from __future__ import annotations

import onnx

from gdn_export.onnx.forms import MS_DOMAIN
from gdn_export.ops.onnx_common import ACTIVATION_TYPES, register_once, tensor_type
from gdn_export.ops.onnx_common import dim as _dim
from gdn_export.ops.onnx_common import rank as _rank

VERSION = 1  # the com.microsoft opset version of the three ops
GATED_DELTA_NET, VARLEN_CONV, GATED_RMS_NORM = "GatedDeltaNet", "VarlenCausalConvWithState", "GatedRMSNorm"
OPS = (GATED_DELTA_NET, VARLEN_CONV, GATED_RMS_NORM)

_S = onnx.defs.OpSchema
_OPTIONAL = _S.FormalParameterOption.Optional
_FLOAT, _INT32 = ["tensor(float)"], ["tensor(int32)"]


def _param(name: str, type_str: str, doc: str, optional: bool = False) -> onnx.defs.OpSchema.FormalParameter:
    if optional:
        return _S.FormalParameter(name, type_str, doc, param_option=_OPTIONAL)
    return _S.FormalParameter(name, type_str, doc)


def _attr(name: str, kind, doc: str) -> onnx.defs.OpSchema.Attribute:
    return _S.Attribute(name, kind, doc, required=False)


def _copy_type(ctx, out_index: int, in_index: int, elem_type: int | None = None) -> None:
    """Output `out_index` typed and shaped as input `in_index` (or with `elem_type`)."""
    t = ctx.get_input_type(in_index)
    if t is None:
        return
    r = _rank(t)
    dims = [_dim(t, i) for i in range(r)] if r is not None else [None]
    ctx.set_output_type(out_index, tensor_type(elem_type or t.tensor_type.elem_type, dims))


def _infer_gated_delta_net(ctx) -> None:
    """output [B, S, Hv, Dv] (value's shape, query's type) for rank-4 q / k / v; final_state as
    initial_state ([B, Hv, Dv, Dk] fp32)."""
    query, value = ctx.get_input_type(0), ctx.get_input_type(2) if ctx.get_num_inputs() > 2 else None
    if query is not None and value is not None and _rank(value) == 4:
        ctx.set_output_type(0, tensor_type(query.tensor_type.elem_type, [_dim(value, i) for i in range(4)]))
    if ctx.get_num_outputs() > 1 and ctx.get_num_inputs() > 6 and ctx.get_input_type(6) is not None:
        _copy_type(ctx, 1, 6, onnx.TensorProto.FLOAT)


def _infer_varlen_conv(ctx) -> None:
    _copy_type(ctx, 0, 0)
    if ctx.get_num_outputs() > 1:
        _copy_type(ctx, 1, 4)


def _gated_delta_net() -> onnx.defs.OpSchema:
    string, integer, real = _S.AttrType.STRING, _S.AttrType.INT, _S.AttrType.FLOAT
    schema = _S(
        GATED_DELTA_NET, MS_DOMAIN, VERSION,
        "ONNX Runtime's packed gated delta net: token-major q / k / v, V-major fp32 state "
        "[B, Hv, Dv, Dk], gates optionally fused (gate_activation, beta_activation, qk_l2_norm).",
        inputs=[_param("query", "T", "[tokens, Hq, Dk] or [B, S, Hq, Dk], or packed QKV"),
                _param("key", "T", "[.., Hq, Dk]", True), _param("value", "T", "[.., Hv, Dv]", True),
                _param("cu_seqlens", "TI", "[N + 1] ragged packing (rank 3)", True),
                _param("decay", "TG", "log decay, or the raw gate with gate_activation", True),
                _param("beta", "TG", "update rate, or its logit with beta_activation", True),
                _param("initial_state", "TS", "[N, Hv, Dv, Dk]", True),
                _param("a_log", "TS", "[Hv]", True), _param("dt_bias", "TS", "[Hv]", True),
                _param("capture_count", "TI", "[N]", True), _param("state_update_active", "TI", "[1]", True)],
        outputs=[_param("output", "T", "[.., Hv, Dv]"), _param("final_state", "TS", "[N, Hv, Dv, Dk]", True),
                 _param("state_update", "TS", "compact per-step transitions", True)],
        type_constraints=[("T", list(ACTIVATION_TYPES), "q / k / v"), ("TS", _FLOAT, "state, a_log, dt_bias"),
                          ("TG", list(ACTIVATION_TYPES), "decay and beta"), ("TI", _INT32, "lengths, counts")],
        attributes=[_attr("update_rule", string, "linear | gated | delta | gated_delta"),
                    _attr("chunk_size", integer, "prefill chunk hint"),
                    _attr("scale", real, "output scale (0: 1/sqrt(Dk))"),
                    _attr("qk_l2_norm", integer, "1: L2-normalise q and k inside"),
                    _attr("gate_activation", string, "none | softplus | sigmoid"),
                    _attr("beta_activation", string, "none | sigmoid"),
                    _attr("gate_lower_bound", real, "bound of the sigmoid gate"),
                    _attr("state_update_capacity", integer, "captured transitions per request")],
    )
    schema.set_type_and_shape_inference_function(_infer_gated_delta_net)
    return schema


def _varlen_conv() -> onnx.defs.OpSchema:
    string, integer = _S.AttrType.STRING, _S.AttrType.INT
    schema = _S(
        VARLEN_CONV, MS_DOMAIN, VERSION,
        "ONNX Runtime's depthwise causal conv over token-major packed sequences, with a carry state.",
        inputs=[_param("input", "T", "[tokens, C]"), _param("weight", "T", "[C, 1, K]"),
                _param("cumulative_sequence_length", "M", "[N + 1]"), _param("bias", "T", "[C]", True),
                _param("initial_state", "T", "[N, C, K-1]"), _param("capture_count", "M", "[N]", True),
                _param("kernel_delta", "T", "dynamic taps", True), _param("previous_mask", "T", "[tokens, 1]", True)],
        outputs=[_param("output", "T", "[tokens, C]"), _param("final_state", "T", "[N, C, K-1]"),
                 _param("state_update", "T", "captured inputs", True)],
        type_constraints=[("T", list(ACTIVATION_TYPES), "activations"), ("M", _INT32, "offsets, counts")],
        attributes=[_attr("activation", string, "none | silu | swish"), _attr("dilation", integer, ">= 1"),
                    _attr("state_update_capacity", integer, "0..8"), _attr("delta_offset", integer, "dynamic mode"),
                    _attr("group_size", integer, "dynamic mode")],
    )
    schema.set_type_and_shape_inference_function(_infer_varlen_conv)
    return schema


def _gated_rms_norm() -> onnx.defs.OpSchema:
    schema = _S(
        GATED_RMS_NORM, MS_DOMAIN, VERSION,
        "Y = X * rsqrt(mean(X^2 over groups of C) + epsilon) * scale * activation(gate), in fp32.",
        inputs=[_param("X", "T", "[..., H * C]"), _param("scale", "T", "[C]"), _param("gate", "T", "X's shape")],
        outputs=[_param("Y", "T", "X's shape")],
        type_constraints=[("T", list(ACTIVATION_TYPES), "activations")],
        attributes=[_attr("activation", _S.AttrType.STRING, "silu | swish | sigmoid"),
                    _attr("epsilon", _S.AttrType.FLOAT, "added to the mean of squares")],
    )
    schema.set_type_and_shape_inference_function(lambda ctx: _copy_type(ctx, 0, 0))
    return schema


_MAKERS = {GATED_DELTA_NET: _gated_delta_net, VARLEN_CONV: _varlen_conv, GATED_RMS_NORM: _gated_rms_norm}


def register_schemas() -> None:
    """Register the three schemas with the `onnx` package (a no-op when already registered)."""
    for name, make in _MAKERS.items():
        register_once(name, MS_DOMAIN, make)
