"""ONNX contract of `gdn::gated_delta_rule`: node translation, schema, reference function.

The exported node is exactly what TensorRT's ONNX parser maps to the GatedDeltaRule plugin:

    gdn.GatedDeltaRule(q, k, v, g, beta, initial_state) -> (o, final_state)
        attributes: plugin_version="1", plugin_namespace="gdn", scale (float), use_qk_l2norm (int)

All six inputs are always present (a zero fp32 initial_state is emitted when the torch call
passes None), so the plugin never sees optional inputs. g is always fp32; initial_state and
final_state share the state's storage dtype S (fp32, fp16 or bf16, independent of T), passed
through from the torch call.

`function_proto` is a second, independent implementation of the op in standard ONNX (a Loop over
T carrying the fp32 state [B, Hv, Dk, Dv], cast from S on the way in and back to S once at the end:
the op's rounding rule); it is attached to the model in memory so that ONNX
Runtime can run the node, and is never written into an exported file.
"""

from __future__ import annotations

import onnx
import onnx.parser
from onnx import TensorProto

from gdn_export.ops.gated_delta_rule import (
    FIELD_SCALE,
    FIELD_USE_QK_L2NORM,
    INPUT_NAMES,
    ONNX_DOMAIN,
    OUTPUT_NAMES,
    PLUGIN_NAME,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
)
from gdn_export.ops.gated_delta_rule.naive import L2NORM_EPS
from gdn_export.ops.onnx_common import ACTIVATION_TYPES as _ACTIVATION_TYPES
from gdn_export.ops.onnx_common import (function_text, make_op_schema, node_attributes, plugin_node,
                                        register_once, unshape_loop_values)
from gdn_export.ops.onnx_common import dim as _dim
from gdn_export.ops.onnx_common import rank as _rank
from gdn_export.ops.onnx_common import static as _static
from gdn_export.ops.onnx_common import tensor_type as _tensor_type

NODE_ATTRIBUTES, NODE_ATTRIBUTE_VALUES = node_attributes(PLUGIN_VERSION, PLUGIN_NAMESPACE, {
    FIELD_SCALE: onnx.AttributeProto.FLOAT,
    FIELD_USE_QK_L2NORM: onnx.AttributeProto.INT,
})
_STATE_TYPES = _ACTIVATION_TYPES  # the storage dtypes of the recurrent state, S

# ----------------------------------------------------------------------------------- schema


def check_ranks(types, op: str) -> None:
    """ValueError (naming `op`) unless the six input types have the contract's ranks and Hv is a
    multiple of Hk where both are known; shared by gdn.GatedDeltaRuleSteps (onnx_steps.py)."""
    q, _, v = types[:3]
    for name, t, rank in zip(INPUT_NAMES, types, (4, 4, 4, 3, 3, 4)):
        r = _rank(t)
        if r is not None and r != rank:
            raise ValueError(f"{op}: {name} must have rank {rank}, got {r}")
    hk, hv = _static(_dim(q, 2)), _static(_dim(v, 2))
    if hk and hv and hv % hk:
        raise ValueError(f"{op}: value heads ({hv}) must be a multiple of key heads ({hk})")


def _infer(ctx) -> None:
    """o [B, T, Hv, Dv] in v's type; final_state [B, Hv, Dk, Dv] in initial_state's type."""
    types = [ctx.get_input_type(i) for i in range(len(INPUT_NAMES))]
    if any(t is None for t in types):
        return
    q, k, v, g, beta, state = types
    check_ranks(types, PLUGIN_NAME)
    dv = _dim(v, 3)
    ctx.set_output_type(0, _tensor_type(v.tensor_type.elem_type, [_dim(v, i) for i in range(4)]))
    batch = _dim(v, 0) if _dim(v, 0) is not None else _dim(state, 0)
    state_type = state.tensor_type.elem_type or TensorProto.FLOAT
    ctx.set_output_type(1, _tensor_type(state_type, [batch, _dim(v, 2), _dim(q, 3), dv]))


def schema_parts() -> dict:
    """What the schemas of gdn.GatedDeltaRule and gdn.GatedDeltaRuleSteps share, as make_op_schema
    takes it: the six inputs (name, type, shape), the type constraints T and S, the two attributes."""
    kinds = ("T", "T", "T", "tensor(float)", "T", "S")
    shapes = ("[B, T, Hk, Dk]", "[B, T, Hk, Dk]", "[B, T, Hv, Dv]", "[B, T, Hv] log decay", "[B, T, Hv]",
              "[B, Hv, Dk, Dv]")
    return dict(inputs=list(zip(INPUT_NAMES, kinds, shapes)),
                type_constraints=[("T", list(_ACTIVATION_TYPES), "activation dtype"),
                                  ("S", list(_STATE_TYPES), "recurrent state storage dtype (math is fp32)")],
                attributes=[(FIELD_SCALE, onnx.defs.OpSchema.AttrType.FLOAT, "multiplies q"),
                            (FIELD_USE_QK_L2NORM, onnx.defs.OpSchema.AttrType.INT, "0/1: L2-normalise q and k")])


def make_schema() -> onnx.defs.OpSchema:
    """The OpSchema of gdn.GatedDeltaRule (version DOMAIN_VERSION), with shape inference."""
    return make_op_schema(
        PLUGIN_NAME, ONNX_DOMAIN, "Gated delta rule over T tokens (see gdn_export.ops.gated_delta_rule).",
        outputs=[(OUTPUT_NAMES[0], "T", "[B, T, Hv, Dv]"), (OUTPUT_NAMES[1], "S", "[B, Hv, Dk, Dv]")],
        infer=_infer, **schema_parts(),
    )


def register_schema() -> None:
    """Register the schema with the `onnx` package once (checker, shape inference, onnxscript)."""
    register_once(PLUGIN_NAME, ONNX_DOMAIN, make_schema)


# ------------------------------------------------------------------------------ translation


def translation(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens=None):
    """onnxscript translation of torch.ops.gdn.gated_delta_rule.default for the dynamo exporter.

    Emits one gdn.GatedDeltaRule node; a None initial_state becomes zeros [B, Hv, Dk, Dv] fp32,
    a given one keeps its dtype (fp32, fp16 or bf16: the state's storage dtype; float64 -> fp32).
    """
    if cu_seqlens is not None:
        raise ValueError("gdn.GatedDeltaRule has no cu_seqlens input: export padded batches (B, T)")
    register_schema()
    g, initial_state = node_state_inputs(q, v, g, initial_state)
    return plugin_node(PLUGIN_NAME, ONNX_DOMAIN, PLUGIN_VERSION, PLUGIN_NAMESPACE,
                       q, k, v, g, beta, initial_state,
                       scale=float(scale), use_qk_l2norm=int(bool(use_qk_l2norm)))


def node_state_inputs(q, v, g, initial_state):
    """(g as fp32, initial_state as the node takes it: zeros [B, Hv, Dk, Dv] fp32 for None, a given
    one in its own dtype, float64 as fp32), in an onnxscript translation."""
    from onnxscript import ir
    from onnxscript import opset18 as op

    if g.dtype != ir.DataType.FLOAT:
        g = op.Cast(g, to=TensorProto.FLOAT)
    if initial_state is None:
        shape = op.Concat(
            op.Shape(v, start=0, end=1), op.Shape(v, start=2, end=3),
            op.Shape(q, start=3, end=4), op.Shape(v, start=3, end=4), axis=0,
        )
        zero = onnx.helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])
        initial_state = op.ConstantOfShape(shape, value=zero)
    elif initial_state.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        initial_state = op.Cast(initial_state, to=TensorProto.FLOAT)
    return g, initial_state


def torch_target():
    """The torch op overload that `translation` translates."""
    import torch

    import gdn_export.ops.gated_delta_rule  # noqa: F401  (registers torch.ops.gdn.*)

    return torch.ops.gdn.gated_delta_rule.default


# ------------------------------------------------------------------- reference ONNX function

# Per value head, token t:  S <- exp(g_t) S;  u = beta_t (v_t - S^T k_t);  S <- S + k_t u^T;
# o_t = S^T (scale q_t). Written independently of naive.py: time-major tensors, one Loop step
# per token, rank-1 updates as [Dk, 1] x [1, Dv] MatMuls. The state is fp32 inside the Loop and
# cast back to initial_state's dtype once after it (the op's rounding rule).
FUNCTION_TEXT = """
<domain: "{domain}", opset_import: ["" : {opset}]>
{name} <{attrs}> ({inputs}) => ({outputs})
{{
  qf = Cast <to = 1> (q)
  kf = Cast <to = 1> (k)
  vf = Cast <to = 1> (v)
  gf = Cast <to = 1> (g)
  bf = Cast <to = 1> (beta)
  s0 = Cast <to = 1> (initial_state)

  flag = Constant <value_int: int = @{l2attr}> ()
  flag_b = Cast <to = 9> (flag)
  eps = Constant <value_float = {eps}> ()
  last = Constant <value_ints = [-1]> ()
  qsq = Mul (qf, qf)
  qss = ReduceSum <keepdims = 1> (qsq, last)
  qse = Add (qss, eps)
  qrs = Sqrt (qse)
  qnorm = Div (qf, qrs)
  ksq = Mul (kf, kf)
  kss = ReduceSum <keepdims = 1> (ksq, last)
  kse = Add (kss, eps)
  krs = Sqrt (kse)
  knorm = Div (kf, krs)
  qn = Where (flag_b, qnorm, qf)
  kn = Where (flag_b, knorm, kf)
  scale = Constant <value_float: float = @{scaleattr}> ()
  qs = Mul (qn, scale)

  b = Shape <start = 0, end = 1> (v)
  t = Shape <start = 1, end = 2> (v)
  hk = Shape <start = 2, end = 3> (q)
  hv = Shape <start = 2, end = 3> (v)
  dk = Shape <start = 3, end = 4> (q)
  group = Div (hv, hk)
  ax3 = Constant <value_ints = [3]> ()
  grouped = Concat <axis = 0> (b, t, hk, group, dk)
  flat = Concat <axis = 0> (b, t, hv, dk)
  q5 = Unsqueeze (qs, ax3)
  k5 = Unsqueeze (kn, ax3)
  qe = Expand (q5, grouped)
  ke = Expand (k5, grouped)
  qh = Reshape (qe, flat)
  kh = Reshape (ke, flat)

  q_tm = Transpose <perm = [1, 0, 2, 3]> (qh)
  k_tm = Transpose <perm = [1, 0, 2, 3]> (kh)
  v_tm = Transpose <perm = [1, 0, 2, 3]> (vf)
  g_tm = Transpose <perm = [1, 0, 2]> (gf)
  b_tm = Transpose <perm = [1, 0, 2]> (bf)
  ax2 = Constant <value_ints = [2]> ()
  ax23 = Constant <value_ints = [2, 3]> ()

  trip = Squeeze (t)
  go = Constant <value = bool {{1}}> ()
  s_final, o_tm = Loop (trip, go, s0) <body = step (int64 i, bool c_in, float s_in)
                                                => (bool c_out, float s_out, float o_t) {{
    q_t = Gather <axis = 0> (q_tm, i)
    k_t = Gather <axis = 0> (k_tm, i)
    v_t = Gather <axis = 0> (v_tm, i)
    g_t = Gather <axis = 0> (g_tm, i)
    b_t = Gather <axis = 0> (b_tm, i)
    a = Exp (g_t)
    a4 = Unsqueeze (a, ax23)
    s_decayed = Mul (s_in, a4)
    k_row = Unsqueeze (k_t, ax2)
    k_col = Unsqueeze (k_t, ax3)
    predicted = MatMul (k_row, s_decayed)
    v_row = Unsqueeze (v_t, ax2)
    err = Sub (v_row, predicted)
    b4 = Unsqueeze (b_t, ax23)
    u = Mul (b4, err)
    write = MatMul (k_col, u)
    s_out = Add (s_decayed, write)
    q_row = Unsqueeze (q_t, ax2)
    o_row = MatMul (q_row, s_out)
    o_t = Squeeze (o_row, ax2)
    c_out = Identity (c_in)
  }}>
  o_f = Transpose <perm = [1, 0, 2, 3]> (o_tm)
  {o} = CastLike (o_f, v)
  {state} = CastLike (s_final, initial_state)
}}
"""


def function_proto(opset: int) -> onnx.FunctionProto:
    """gdn.GatedDeltaRule in standard ONNX (default domain version `opset`), for ONNX Runtime."""
    text = function_text(
        FUNCTION_TEXT, domain=ONNX_DOMAIN, opset=opset, name=PLUGIN_NAME,
        fields=(FIELD_SCALE, FIELD_USE_QK_L2NORM), inputs=INPUT_NAMES, outputs=OUTPUT_NAMES,
        o=OUTPUT_NAMES[0], state=OUTPUT_NAMES[1],
        l2attr=FIELD_USE_QK_L2NORM, scaleattr=FIELD_SCALE, eps=repr(L2NORM_EPS),
    )
    return unshape_loop_values(onnx.parser.parse_function(text), keep={"i", "c_in", "c_out"})
