"""ONNX contract of `gdn::moe`: node translation, schema, reference function.

The exported node is exactly what TensorRT's ONNX parser maps to the MoE plugin:

    gdn.MoE(hidden, router_logits, gate_up, down) -> out
        attributes: plugin_version="1", plugin_namespace="gdn", top_k (int), norm_topk_prob (int 0/1)

All four inputs are cast to hidden's dtype, so the plugin sees one dtype.

ONNX Runtime runs the node through `function_proto`, a model-local function in standard ONNX
attached in memory (never written into an exported file), rather than a compiled custom op:
the same mechanism as the other gdn ops, so stock onnxruntime runs every exported model, and the
body is an independent second opinion on the torch reference. Its cost follows top-k, not E: a
Loop over the experts that were hit (Unique of the top-k ids) gathers each one's tokens
(NonZero), gathers that expert's weight slices only, runs its SwiGLU as MatMuls and
scatter-adds the weighted result. A dense body would read all E experts at every decode step;
a per-token Gather of [k, 2I, H] slices would need N * k copies of the weights at prefill.
"""

from __future__ import annotations

import onnx
import onnx.parser

from gdn_export.ops.moe import (
    FIELD_NORM_TOPK_PROB,
    FIELD_TOP_K,
    INPUT_NAMES,
    ONNX_DOMAIN,
    OUTPUT_NAMES,
    PLUGIN_NAME,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
)
from gdn_export.ops.onnx_common import ACTIVATION_TYPES as _ACTIVATION_TYPES
from gdn_export.ops.onnx_common import (function_text, make_op_schema, node_attributes, plugin_node,
                                        register_once, unshape_loop_values)
from gdn_export.ops.onnx_common import static as _static

NODE_ATTRIBUTES, NODE_ATTRIBUTE_VALUES = node_attributes(PLUGIN_VERSION, PLUGIN_NAMESPACE, {
    FIELD_TOP_K: onnx.AttributeProto.INT,
    FIELD_NORM_TOPK_PROB: onnx.AttributeProto.INT,
})

# ----------------------------------------------------------------------------------- schema


def _dims(type_proto: onnx.TypeProto):
    tt = type_proto.tensor_type
    return list(tt.shape.dim) if tt.HasField("shape") else None


def _infer(ctx) -> None:
    """out [N, H] in hidden's type; ranks and the static E / H / I checked where known."""
    types = [ctx.get_input_type(i) for i in range(len(INPUT_NAMES))]
    if any(t is None for t in types):
        return
    dims = dict(zip(INPUT_NAMES, (_dims(t) for t in types)))
    for name, rank in zip(INPUT_NAMES, (2, 2, 3, 3)):
        if dims[name] is not None and len(dims[name]) != rank:
            raise ValueError(f"{PLUGIN_NAME}: {name} must have rank {rank}, got {len(dims[name])}")

    def size(name, axis):
        return None if dims[name] is None else _static(dims[name][axis])

    for what, a, b in (("router_logits E vs gate_up", size("router_logits", 1), size("gate_up", 0)),
                       ("gate_up E vs down", size("gate_up", 0), size("down", 0)),
                       ("hidden H vs gate_up", size("hidden", 1), size("gate_up", 2)),
                       ("hidden H vs down", size("hidden", 1), size("down", 1))):
        if a and b and a != b:
            raise ValueError(f"{PLUGIN_NAME}: {what} must agree, got {a} and {b}")
    two_i, i = size("gate_up", 1), size("down", 2)
    if two_i and i and two_i != 2 * i:
        raise ValueError(f"{PLUGIN_NAME}: gate_up must be [E, 2I, H] with I={i} from down, got 2I={two_i}")
    top_k = ctx.get_attribute(FIELD_TOP_K) if hasattr(ctx, "get_attribute") else None
    experts = size("router_logits", 1)
    if top_k is not None and experts and not 1 <= top_k.i <= experts:
        raise ValueError(f"{PLUGIN_NAME}: top_k must be in [1, E={experts}], got {top_k.i}")
    out = onnx.TypeProto()
    out.tensor_type.elem_type = types[0].tensor_type.elem_type
    if dims["hidden"] is not None:
        for d in dims["hidden"]:
            out.tensor_type.shape.dim.add().CopyFrom(d)
    ctx.set_output_type(0, out)


def make_schema() -> onnx.defs.OpSchema:
    """The OpSchema of gdn.MoE (version DOMAIN_VERSION), with shape inference."""
    shapes = dict(zip(INPUT_NAMES, ("[N, H]", "[N, E]", "[E, 2I, H]", "[E, H, I]")))
    return make_op_schema(
        PLUGIN_NAME, ONNX_DOMAIN, "Top-k routed SwiGLU experts (see gdn_export.ops.moe).",
        inputs=[(n, "T", shapes[n]) for n in INPUT_NAMES],
        outputs=[(OUTPUT_NAMES[0], "T", "[N, H]")],
        type_constraints=[("T", list(_ACTIVATION_TYPES), "activation and weight dtype")],
        attributes=[(FIELD_TOP_K, onnx.defs.OpSchema.AttrType.INT, "experts per token, 1..E"),
                    (FIELD_NORM_TOPK_PROB, onnx.defs.OpSchema.AttrType.INT, "1: renormalise the top-k weights")],
        infer=_infer,
    )


def register_schema() -> None:
    """Register the schema with the `onnx` package once (checker, shape inference, onnxscript)."""
    register_once(PLUGIN_NAME, ONNX_DOMAIN, make_schema)


# ------------------------------------------------------------------------------ translation


def translation(hidden, router_logits, gate_up, down, top_k, norm_topk_prob):
    """onnxscript translation of torch.ops.gdn.moe.default for the dynamo exporter: one gdn.MoE node."""
    from onnxscript import opset18 as op

    register_schema()
    router_logits, gate_up, down = (
        t if t.dtype == hidden.dtype else op.CastLike(t, hidden) for t in (router_logits, gate_up, down)
    )
    return plugin_node(PLUGIN_NAME, ONNX_DOMAIN, PLUGIN_VERSION, PLUGIN_NAMESPACE,
                       hidden, router_logits, gate_up, down,
                       top_k=int(top_k), norm_topk_prob=int(bool(norm_topk_prob)))


def torch_target():
    """The torch op overload that `translation` translates."""
    import torch

    import gdn_export.ops.moe  # noqa: F401  (registers torch.ops.gdn.moe)

    return torch.ops.gdn.moe.default


# ------------------------------------------------------------------- reference ONNX function

# Routing in fp32: Softmax, TopK, optional renormalisation. Pairs (token n, slot j) flattened to
# p = n * k + j. The Loop walks the experts that were hit; step e takes its pairs (NonZero),
# their tokens, that expert's gate_up / down slices (the only weights read), runs the SwiGLU,
# weights the rows and scatter-adds them into the fp32 accumulator.
_FUNCTION_TEXT = """
<domain: "{domain}", opset_import: ["" : {opset}]>
{name} <{attrs}> ({inputs}) => ({outputs})
{{
  xf = Cast <to = 1> (hidden)
  lf = Cast <to = 1> (router_logits)
  probs = Softmax <axis = -1> (lf)
  k0 = Constant <value_int: int = @{topk}> ()
  one1 = Constant <value_ints = [1]> ()
  k1 = Reshape (k0, one1)
  top_p, top_e = TopK <axis = -1, largest = 1, sorted = 1> (probs, k1)
  last = Constant <value_ints = [-1]> ()
  top_sum = ReduceSum <keepdims = 1> (top_p, last)
  top_n = Div (top_p, top_sum)
  norm0 = Constant <value_int: int = @{normattr}> ()
  norm = Cast <to = 9> (norm0)
  top_w = Where (norm, top_n, top_p)

  pair_e = Reshape (top_e, last)
  pair_w = Reshape (top_w, last)
  zero = Constant <value = int64 {{0}}> ()
  one = Constant <value = int64 {{1}}> ()
  pairs1 = Shape (pair_e)
  pairs = Squeeze (pairs1)
  pair_ids = Range (zero, pairs, one)
  pair_tok = Div (pair_ids, k0)
  experts = Unique <sorted = 1> (pair_e)
  hit1 = Shape (experts)
  hit = Squeeze (hit1)
  i2 = Shape <start = 2, end = 3> (down)
  i1 = Squeeze (i2)
  i_end = Add (i1, i1)
  ax0 = Constant <value_ints = [0]> ()
  ax1 = Constant <value_ints = [1]> ()
  x_shape = Shape (xf)
  acc0 = ConstantOfShape <value = float[1] {{0.0}}> (x_shape)
  go = Constant <value = bool {{1}}> ()
  acc = Loop (hit, go, acc0) <body = step (int64 s, bool c_in, float acc_in) => (bool c_out, float acc_out) {{
    e = Gather <axis = 0> (experts, s)
    mine = Equal (pair_e, e)
    where = NonZero (mine)
    sel = Squeeze (where, ax0)
    tok = Gather <axis = 0> (pair_tok, sel)
    w = Gather <axis = 0> (pair_w, sel)
    x = Gather <axis = 0> (xf, tok)
    gu_raw = Gather <axis = 0> (gate_up, e)
    dn_raw = Gather <axis = 0> (down, e)
    gu = Cast <to = 1> (gu_raw)
    dn = Cast <to = 1> (dn_raw)
    gu_t = Transpose <perm = [1, 0]> (gu)
    h = MatMul (x, gu_t)
    i_lo = Unsqueeze (zero, ax0)
    i_mid = Unsqueeze (i1, ax0)
    i_hi = Unsqueeze (i_end, ax0)
    g = Slice (h, i_lo, i_mid, ax1)
    u = Slice (h, i_mid, i_hi, ax1)
    sg = Sigmoid (g)
    gs = Mul (g, sg)
    act = Mul (gs, u)
    dn_t = Transpose <perm = [1, 0]> (dn)
    y = MatMul (act, dn_t)
    w_col = Unsqueeze (w, ax1)
    yw = Mul (y, w_col)
    tok_col = Unsqueeze (tok, ax1)
    acc_out = ScatterND <reduction = "add"> (acc_in, tok_col, yw)
    c_out = Identity (c_in)
  }}>
  {out} = CastLike (acc, hidden)
}}
"""


def function_proto(opset: int) -> onnx.FunctionProto:
    """gdn.MoE in standard ONNX (default domain version `opset`), for ONNX Runtime."""
    text = function_text(
        _FUNCTION_TEXT, domain=ONNX_DOMAIN, opset=opset, name=PLUGIN_NAME,
        fields=(FIELD_TOP_K, FIELD_NORM_TOPK_PROB), inputs=INPUT_NAMES, outputs=OUTPUT_NAMES,
        out=OUTPUT_NAMES[0], topk=FIELD_TOP_K, normattr=FIELD_NORM_TOPK_PROB,
    )
    # the accumulator of the Loop is [N, H], not the scalar the text format writes
    return unshape_loop_values(onnx.parser.parse_function(text), keep={"s", "c_in", "c_out"})
