"""The nodes that replace one gdn node in the ort form (semantics: gdn_export.onnx.ort_form).

    gdr_block   gdn.GatedDeltaRule (+ its gate, beta and output-norm chains where they match)
                -> com.microsoft.GatedDeltaNet (+ GatedRMSNorm)
    conv_block  gdn.CausalConv1d -> com.microsoft.VarlenCausalConvWithState, new state gathered
                at each row's last real token

Each returns its Blocks (the nodes, in order) keyed by the graph node each takes the place of, that
node named by its first output (the gdn node; the norm's last node).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from gdn_export.errors import GdnExportError
from gdn_export.onnx.forms import MS_DOMAIN
from gdn_export.onnx.ort_form.patterns import GraphIndex, match_beta, match_gate, match_norm
from gdn_export.onnx.ort_form.schemas import GATED_DELTA_NET, GATED_RMS_NORM, VARLEN_CONV
from gdn_export.onnx.rewrite import Block, gdr_fields, l2norm, static_dims
from gdn_export.ops.causal_conv1d import ACTIVATION_SILU
from gdn_export.ops.gated_delta_rule.naive import L2NORM_EPS

KEY_ORT_BLOCK = "gdn_export.ort_block"  # node metadata: the ort block a node belongs to
F32 = TensorProto.FLOAT
V_MAJOR = [0, 1, 3, 2]  # [B, Hv, Dk, Dv] <-> GatedDeltaNet's [B, Hv, Dv, Dk]
# -exp(a_log) softplus(decay + dt_bias): onnxruntime 1.31 names it "qwen" only, 1.32 "softplus" and
# "qwen" (a legacy alias there); "qwen" serves both.
GATE_SOFTPLUS = "qwen"


def _elem(types, name: str) -> int:
    return types[name].tensor_type.elem_type


def _lowest(b: Block, elem: int) -> str:
    """A scalar constant of type `elem` holding its lowest finite value: a padded token's raw gate
    and beta logit, which softplus and sigmoid take to exactly 0 (an identity step)."""
    low = {F32: np.finfo(np.float32).min, TensorProto.FLOAT16: np.finfo(np.float16).min,
           TensorProto.BFLOAT16: np.float32(-3.3895313892515355e38)}[elem]  # bf16's lowest, exact in fp32
    c = b.const(np.array(low, np.float32), "lowest")
    return c if elem == F32 else b.cast(c, elem)


def _masked(b: Block, x: str, mask: str | None, types) -> str:
    return x if mask is None else b.add("Where", [mask, x, _lowest(b, _elem(types, x))])


def _same_type(b: Block, decay: str, decay_type: int, beta: str, beta_type: int) -> tuple[str, str]:
    """GatedDeltaNet takes decay and beta of one type: fp32 both where they differ."""
    if decay_type == beta_type:
        return decay, beta
    return (decay if decay_type == F32 else b.cast(decay, F32)), (beta if beta_type == F32 else b.cast(beta, F32))


def gdr_block(node: onnx.NodeProto, G: GraphIndex, types, block_id: str) -> dict[str, Block]:
    """gdn.GatedDeltaRule(q, k, v, g, beta, s0) -> (o, final_state) as one GatedDeltaNet, and the
    output norm as one GatedRMSNorm where it matches."""
    q, k, v, g, beta, s0 = node.input
    o, final = node.output
    _, _, hv, _, _, scale, l2 = gdr_fields(node, types, GATED_DELTA_NET)
    t_type, s_type = _elem(types, v), _elem(types, s0)
    b = Block(block_id, KEY_ORT_BLOCK)
    if l2:
        # The op's qk_l2_norm uses another epsilon than L2NORM_EPS: normalised here in fp32.
        last = b.const(np.array([-1], np.int64), "last")
        eps = b.const(np.array(L2NORM_EPS, np.float32), "eps")
        q, k = (l2norm(b, x if t_type == F32 else b.cast(x, F32), last, eps) for x in (q, k))
        if t_type != F32:
            q, k = b.cast(q, t_type), b.cast(k, t_type)
    op_attrs = {"scale": scale, "update_rule": "gated_delta"}
    gate, logit = match_gate(G, g, hv), match_beta(G, beta)
    extra, g_type, beta_type = [], _elem(types, g), _elem(types, beta)
    if gate is not None:
        g, g_type = _masked(b, gate.a, gate.mask, types), _elem(types, gate.a)
        extra = [b.const(gate.a_log, "a_log"), b.const(gate.dt_bias, "dt_bias")]
        op_attrs["gate_activation"] = GATE_SOFTPLUS
    if logit is not None:
        beta, beta_type = _masked(b, logit.b, logit.mask, types), _elem(types, logit.b)
        op_attrs["beta_activation"] = "sigmoid"
    g, beta = _same_type(b, g, g_type, beta, beta_type)
    state = b.add("Transpose", [s0 if s_type == F32 else b.cast(s0, F32)], perm=V_MAJOR)
    _, fs = b.add(GATED_DELTA_NET, [q, k, v, "", g, beta, state, *extra], [o, b.name("final_state")],
                  domain=MS_DOMAIN, **op_attrs)
    if s_type == F32:
        b.add("Transpose", [fs], [final], perm=V_MAJOR)
    else:
        b.add("Cast", [b.add("Transpose", [fs], perm=V_MAJOR)], [final], to=s_type)
    blocks = {o: b}
    norm = match_norm(G, o, t_type)
    weight = None if norm is None else _norm_weight(norm, G, types, t_type)
    if norm is not None and weight is not None:
        nb = Block(block_id + "/norm", KEY_ORT_BLOCK)
        if not isinstance(weight, str):
            weight = nb.cast(nb.const(weight, "weight"), t_type)
        nb.add(GATED_RMS_NORM, [o, weight, norm.z], [norm.y], domain=MS_DOMAIN, activation="silu",
               epsilon=norm.eps)
        blocks[norm.last.output[0]] = nb
    return blocks


def _norm_weight(norm, G: GraphIndex, types, t_type: int):
    """GatedRMSNorm's scale in the model dtype: a tensor name, or fp32 values that the dtype holds
    exactly (to be cast); None when the weight is not exactly a model-dtype value."""
    if t_type == F32:
        return norm.weight
    src = G.uncast(norm.weight)
    if src != norm.weight and _elem(types, src) == t_type:
        return src
    w = norm.weight_values.astype(np.float32)
    if t_type == TensorProto.FLOAT16:
        exact = np.array_equal(w.astype(np.float16).astype(np.float32), w)
    else:  # bf16: the low 16 bits of each fp32 value are zero
        exact = not np.any(w.view(np.uint32) & 0xFFFF)
    return w if exact else None


def conv_block(node: onnx.NodeProto, G: GraphIndex, types, block_id: str) -> dict[str, Block]:
    """gdn.CausalConv1d(x, weight, bias, state, seq_lens) -> (y, new_state) as one
    VarlenCausalConvWithState over the B rows of T tokens (uniform cu_seqlens); the new state is
    [state | x] at columns L_b .. L_b + K-2 (L_b = seq_lens clamped to [0, T]), gathered from the
    state (columns < K-1) and from x (the rest), so a row keeps its state at L_b = 0."""
    x, weight, bias, state, seq_lens = node.input
    y, new_state = node.output
    what = f"{node.domain}.{node.op_type} node {node.name!r}"
    c, k = static_dims(types, weight, 2, what)
    if c is None or k is None or k < 2:
        raise GdnExportError(f"cannot rewrite {what}: channels and kernel width must be static, K >= 2 "
                             f"(weight [{c}, {k}])")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    b = Block(block_id, KEY_ORT_BLOCK)
    i64 = lambda values, hint: b.const(np.array(values, np.int64), hint)  # noqa: E731
    tokens = b.add("Reshape", [x, i64([-1, c], "tokens_c")])
    t = b.add("Shape", [x], start=1, end=2)                                         # [1] = T
    n = b.add("Shape", [tokens], start=0, end=1)                                    # [1] = B*T
    one = i64([1], "one")
    cu = b.cast(b.add("Range", [i64(0, "zero"), b.add("Squeeze", [b.add("Add", [n, one])]),
                                b.add("Squeeze", [t])]), TensorProto.INT32)         # [0, T, .., B*T]
    w3 = b.add("Unsqueeze", [weight, one])
    y2, _ = b.add(VARLEN_CONV, [tokens, w3, cu, bias, state], [b.name("output"), b.name("final_state")],
                  domain=MS_DOMAIN, activation="silu" if attrs["activation"] == ACTIVATION_SILU else "none")
    b.add("Reshape", [y2, b.add("Shape", [x])], [y])
    lens = b.add("Min", [b.add("Max", [b.cast(seq_lens, TensorProto.INT64), i64([0], "zero1")]), t])
    index = b.add("Add", [b.add("Unsqueeze", [lens, one]), i64([np.arange(k - 1)], "cols")])  # [B, K-1]
    batch = b.add("Shape", [x], start=0, end=1)
    from_x = b.add("Max", [b.add("Sub", [index, i64(k - 1, "km1")]), i64(0, "zero2")])
    from_x = b.add("Expand", [b.add("Unsqueeze", [from_x, i64([2], "ax2")]),
                              b.add("Concat", [batch, i64([k - 1, c], "km1_c")], axis=0)])
    x_cols = b.add("Transpose", [b.add("GatherElements", [x, from_x], axis=1)], perm=[0, 2, 1])
    from_s = b.add("Min", [index, i64(k - 2, "km2")])
    from_s = b.add("Expand", [b.add("Unsqueeze", [from_s, one]),
                              b.add("Concat", [batch, i64([c, k - 1], "c_km1")], axis=0)])
    s_cols = b.add("GatherElements", [state, from_s], axis=2)
    in_state = b.add("Unsqueeze", [b.add("Less", [index, i64(k - 1, "km1b")]), one])   # [B, 1, K-1]
    b.add("Where", [in_state, s_cols, x_cols], [new_state])
    return {y: b}
