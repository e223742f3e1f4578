"""ONNX contract of `gdn::causal_conv1d`: node translation, schema, reference function.

The exported node is exactly what TensorRT's ONNX parser maps to the CausalConv1d plugin:

    gdn.CausalConv1d(x, weight, bias, conv_state, seq_lens) -> (y, new_conv_state)
        attributes: plugin_version="1", plugin_namespace="gdn", activation (int 0 none / 1 SiLU)

All five inputs are always present: zero bias [C], zero conv_state [B, C, K-1] and seq_lens = T
for every row ([B] int32) are emitted when the torch call passes None, and bias, weight and
conv_state are cast to x's dtype, so the plugin sees one activation dtype (and int32 lengths).

`function_proto` is an independent implementation in standard ONNX (a Gather of the K-tap windows
and a weighted sum, since Conv's `group` cannot follow a dynamic C inside a function; the new state
is a GatherElements of the K-1 columns ending at each row's length); it is
attached in memory for ONNX Runtime and never written into an exported file.
"""

from __future__ import annotations

import onnx
import onnx.parser

from gdn_export.ops.causal_conv1d import (
    ACTIVATION_NONE,
    ACTIVATION_SILU,
    FIELD_ACTIVATION,
    INPUT_NAMES,
    ONNX_DOMAIN,
    OUTPUT_NAMES,
    PLUGIN_NAME,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
)
from gdn_export.ops.onnx_common import ACTIVATION_TYPES as _ACTIVATION_TYPES
from gdn_export.ops.onnx_common import (function_text, make_op_schema, node_attributes, plugin_node,
                                        register_once)
from gdn_export.ops.onnx_common import dim as _dim
from gdn_export.ops.onnx_common import rank as _rank
from gdn_export.ops.onnx_common import static as _static
from gdn_export.ops.onnx_common import tensor_type as _tensor_type

NODE_ATTRIBUTES, NODE_ATTRIBUTE_VALUES = node_attributes(PLUGIN_VERSION, PLUGIN_NAMESPACE, {
    FIELD_ACTIVATION: onnx.AttributeProto.INT,
})
_INPUT_RANKS = {"x": 3, "weight": 2, "bias": 1, "conv_state": 3, "seq_lens": 1}

# ----------------------------------------------------------------------------------- schema


def _infer(ctx) -> None:
    """y [B, T, C] and new_conv_state [B, C, K-1], both in x's type."""
    types = [ctx.get_input_type(i) for i in range(len(INPUT_NAMES))]
    if any(t is None for t in types):
        return
    x, weight, bias, state, seq_lens = types
    for name, t in zip(INPUT_NAMES, types):
        r = _rank(t)
        if r is not None and r != _INPUT_RANKS[name]:
            raise ValueError(f"{PLUGIN_NAME}: {name} must have rank {_INPUT_RANKS[name]}, got {r}")
    if seq_lens.tensor_type.elem_type not in (0, onnx.TensorProto.INT32):
        raise ValueError(f"{PLUGIN_NAME}: seq_lens must be int32, got "
                         f"{onnx.TensorProto.DataType.Name(seq_lens.tensor_type.elem_type)}")
    c, wc = _static(_dim(x, 2)), _static(_dim(weight, 0))
    if c and wc and c != wc:
        raise ValueError(f"{PLUGIN_NAME}: weight must be [C={c}, K], got C={wc}")
    elem = x.tensor_type.elem_type
    ctx.set_output_type(0, _tensor_type(elem, [_dim(x, i) for i in range(3)]))
    # K-1 is only known statically from weight (it always is: weights are initializers).
    k = _static(_dim(weight, 1))
    taps = None
    if k is not None:
        taps = onnx.TensorShapeProto.Dimension(dim_value=k - 1)
    elif _dim(state, 2) is not None:
        taps = _dim(state, 2)
    ctx.set_output_type(1, _tensor_type(elem, [_dim(x, 0), _dim(x, 2), taps]))


def make_schema() -> onnx.defs.OpSchema:
    """The OpSchema of gdn.CausalConv1d (version DOMAIN_VERSION), with shape inference."""
    shapes = dict(zip(INPUT_NAMES, ("[B, T, C]", "[C, K]", "[C]", "[B, C, K-1]", "[B] real tokens per row")))
    return make_op_schema(
        PLUGIN_NAME, ONNX_DOMAIN, "Depthwise causal conv1d with a rolling state (see gdn_export.ops.causal_conv1d).",
        inputs=[(n, "I" if n == "seq_lens" else "T", shapes[n]) for n in INPUT_NAMES],
        outputs=[(OUTPUT_NAMES[0], "T", "[B, T, C]"), (OUTPUT_NAMES[1], "T", "[B, C, K-1]")],
        type_constraints=[("T", list(_ACTIVATION_TYPES), "activation dtype"),
                          ("I", ["tensor(int32)"], "row lengths")],
        attributes=[(FIELD_ACTIVATION, onnx.defs.OpSchema.AttrType.INT,
                     f"{ACTIVATION_NONE} none, {ACTIVATION_SILU} SiLU")],
        infer=_infer,
    )


def register_schema() -> None:
    """Register the schema with the `onnx` package once (checker, shape inference, onnxscript)."""
    register_once(PLUGIN_NAME, ONNX_DOMAIN, make_schema)


# ------------------------------------------------------------------------------ translation


def translation(x, weight, bias, conv_state, silu, seq_lens=None):
    """onnxscript translation of torch.ops.gdn.causal_conv1d.default for the dynamo exporter.

    Emits one gdn.CausalConv1d node; None bias / conv_state become zeros in x's dtype, None seq_lens
    becomes T for every row ([B] int32).
    """
    from onnxscript import opset18 as op

    register_schema()
    # Zeros as a scalar in x's dtype expanded to the shape: ConstantOfShape would be folded by
    # the exporter's optimizer into a bfloat16 ConstantOfShape, which opsets < 20 reject.
    zero = op.CastLike(op.Constant(value_float=0.0), x)
    if bias is None:
        bias = op.Expand(zero, op.Shape(weight, start=0, end=1))
    if conv_state is None:
        one = op.Constant(value_ints=[1])
        shape = op.Concat(
            op.Shape(x, start=0, end=1), op.Shape(weight, start=0, end=1),
            op.Sub(op.Shape(weight, start=1, end=2), one), axis=0,
        )
        conv_state = op.Expand(zero, shape)
    if seq_lens is None:
        seq_lens = op.Expand(op.Cast(op.Shape(x, start=1, end=2), to=onnx.TensorProto.INT32),
                             op.Shape(x, start=0, end=1))
    elif seq_lens.dtype != onnx.TensorProto.INT32:
        seq_lens = op.Cast(seq_lens, to=onnx.TensorProto.INT32)
    weight, bias, conv_state = (
        t if t.dtype == x.dtype else op.CastLike(t, x) for t in (weight, bias, conv_state)
    )
    return plugin_node(PLUGIN_NAME, ONNX_DOMAIN, PLUGIN_VERSION, PLUGIN_NAMESPACE,
                       x, weight, bias, conv_state, seq_lens,
                       activation=ACTIVATION_SILU if silu else ACTIVATION_NONE)


def torch_target():
    """The torch op overload that `translation` translates."""
    import torch

    import gdn_export.ops.causal_conv1d  # noqa: F401  (registers torch.ops.gdn.*)

    return torch.ops.gdn.causal_conv1d.default


# ------------------------------------------------------------------- reference ONNX function

# xs = concat(state, x^T) [B, C, K-1+T]; window[b, c, t, j] = xs[b, c, t + j] gathered with an
# index grid [T, K]; y = sum_j window * weight[c, j] + bias (fp32), SiLU if asked.
# new_state[b, c, i] = xs[b, c, L_b + i] (GatherElements), L clamped to [0, T] as the kernels do.
_FUNCTION_TEXT = """
<domain: "{domain}", opset_import: ["" : {opset}]>
{name} <{attrs}> ({inputs}) => ({outputs})
{{
  xf = Cast <to = 1> (x)
  wf = Cast <to = 1> (weight)
  bf = Cast <to = 1> (bias)
  sf = Cast <to = 1> (conv_state)
  x_ct = Transpose <perm = [0, 2, 1]> (xf)
  xs = Concat <axis = 2> (sf, x_ct)

  zero = Constant <value = int64 {{0}}> ()
  one = Constant <value = int64 {{1}}> ()
  one1 = Constant <value_ints = [1]> ()
  ax0 = Constant <value_ints = [0]> ()
  ax1 = Constant <value_ints = [1]> ()
  ax2 = Constant <value_ints = [2]> ()
  ax3 = Constant <value_ints = [3]> ()
  t1 = Shape <start = 1, end = 2> (x)
  k1 = Shape <start = 1, end = 2> (weight)
  t = Squeeze (t1)
  k = Squeeze (k1)
  steps = Range (zero, t, one)
  taps = Range (zero, k, one)
  steps_col = Unsqueeze (steps, ax1)
  taps_row = Unsqueeze (taps, ax0)
  index = Add (steps_col, taps_row)
  windows = Gather <axis = 2> (xs, index)
  w_c1k = Unsqueeze (wf, ax1)
  w_bc1k = Unsqueeze (w_c1k, ax0)
  prod = Mul (windows, w_bc1k)
  conv = ReduceSum <keepdims = 0> (prod, ax3)
  b_c1 = Unsqueeze (bf, ax1)
  pre = Add (conv, b_c1)

  act = Constant <value_int: int = @{actattr}> ()
  silu_id = Constant <value_int = {silu}> ()
  is_silu = Equal (act, silu_id)
  gate = Sigmoid (pre)
  silu = Mul (pre, gate)
  y_ct = Where (is_silu, silu, pre)
  y_f = Transpose <perm = [0, 2, 1]> (y_ct)
  {y} = CastLike (y_f, x)

  k_minus_1 = Sub (k1, one1)
  km1 = Squeeze (k_minus_1)
  lens64 = Cast <to = 7> (seq_lens)
  lens_lo = Max (lens64, zero)
  lens = Min (lens_lo, t)
  cols = Range (zero, km1, one)
  lens_col = Unsqueeze (lens, ax1)
  cols_row = Unsqueeze (cols, ax0)
  tail_bk = Add (lens_col, cols_row)
  tail_b1k = Unsqueeze (tail_bk, ax1)
  b1 = Shape <start = 0, end = 1> (x)
  c1 = Shape <start = 2, end = 3> (x)
  tail_shape = Concat <axis = 0> (b1, c1, k_minus_1)
  tail_index = Expand (tail_b1k, tail_shape)
  tail = GatherElements <axis = 2> (xs, tail_index)
  {state} = CastLike (tail, x)
}}
"""


def function_proto(opset: int) -> onnx.FunctionProto:
    """gdn.CausalConv1d in standard ONNX (default domain version `opset`), for ONNX Runtime."""
    return onnx.parser.parse_function(function_text(
        _FUNCTION_TEXT, domain=ONNX_DOMAIN, opset=opset, name=PLUGIN_NAME, fields=(FIELD_ACTIVATION,),
        inputs=INPUT_NAMES, outputs=OUTPUT_NAMES,
        y=OUTPUT_NAMES[0], state=OUTPUT_NAMES[1], actattr=FIELD_ACTIVATION, silu=ACTIVATION_SILU,
    ))
