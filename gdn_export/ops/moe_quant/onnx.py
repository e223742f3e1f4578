"""ONNX translations of gdn::moe_fp8 / gdn::moe_int4: standard DequantizeLinear (opset >= 21) of the
stacked expert weights feeding the unchanged gdn.MoE node (gdn_export.ops.moe.onnx):

    gate_up FLOAT8E4M3FN [E, 2I, H] -> DequantizeLinear(scale [E, 2I, G] in hidden's dtype, axis 2,
        block_size H (per channel, G = 1) or 128 (published blocks)) -> gdn.MoE input 2; down likewise
    gate_up INT4 [E, 2I, H] (initializer) -> DequantizeLinear(scale [E, 2I, ceil(H/g)], axis 2,
        block_size g) -> gdn.MoE input 2; down likewise

The MoE node, its TensorRT plugin and its ONNX function body receive 16-bit weights: the weights are
stored quantized in the file, dequantized once by the DequantizeLinear (ONNX Runtime) or by a
standalone dequantize layer (TensorRT). The per-expert FP8 activation scales of moe_fp8 cannot be
expressed outside the node (each token's activation is quantized by the scale of the expert it is
routed to), so the graph keeps the experts' activations in 16 bits and the scales are not written;
`validate` runs its PyTorch reference the same way (Fp8MoeExperts.activations = "16bit").

Where K is not a multiple of the block, the DequantizeLinear block is gcd(K, block) with each scale
repeated (TensorRT's parser takes whole blocks only; the weights stay exactly the same). The INT4
weights are unpacked from their uint8 buffers with standard ops (the exporter hands translations
values, not data); `fold_int4_expert_weights`, run by export, turns each such chain into one INT4
initializer.
"""

from __future__ import annotations

import math

from gdn_export.ops.moe import onnx as moe_onnx
from gdn_export.ops.quant_linear.onnx import INT4, fold_int4_chains, signed_int4

BLOCK = 128


def _op():
    from onnxscript.onnx_opset import opset21 as op

    return op


def _block(K: int, group: int) -> int:
    return group if K % group == 0 else math.gcd(K, group)


def _expand_last(op, s, r: int, keep: int):
    """3-D s [E, N, G] with each scale along the last axis repeated r times, cut to `keep`."""
    if r == 1:
        return s
    s4 = op.Unsqueeze(s, op.Constant(value_ints=[3]))
    shape = op.Concat(op.Shape(s), op.Constant(value_ints=[r]), axis=0)
    flat = op.Reshape(op.Expand(s4, shape), op.Concat(op.Shape(s, start=0, end=2), op.Constant(value_ints=[-1]),
                                                      axis=0))
    return op.Slice(flat, op.Constant(value_ints=[0]), op.Constant(value_ints=[keep]), op.Constant(value_ints=[2]))


def _dequantize(op, w, scale, K: int, group: int, like):
    """DequantizeLinear of w [E, N, K] (FLOAT8 or INT4) with scale [E, N, G] along axis 2."""
    s = op.CastLike(scale, like)
    b = _block(K, group)
    if b != group:
        s = _expand_last(op, s, group // b, K // b)
    return op.DequantizeLinear(w, s, axis=2, block_size=b)


def moe_fp8_translation(hidden, router_logits, gate_up, gate_up_scale, down, down_scale, gate_up_input_scale,
                        down_input_scale, top_k, norm_topk_prob):
    op = _op()
    H, I = gate_up.shape[2], down.shape[2]
    gu_g, dn_g = gate_up_scale.shape[2], down_scale.shape[2]
    gu = _dequantize(op, gate_up, gate_up_scale, H, H if gu_g == 1 else BLOCK, hidden)
    dn = _dequantize(op, down, down_scale, I, I if dn_g == 1 else BLOCK, hidden)
    return moe_onnx.translation(hidden, router_logits, gu, dn, top_k, norm_topk_prob)


def _unpack_int4(op, q, K: int):
    """uint8 [E, N, ceil(K/2)] (low nibble = even k) -> INT4 [E, N, K] with standard ops."""
    low = op.BitwiseAnd(q, op.Cast(op.Constant(value_int=15), to=2))
    high = op.BitShift(q, op.Cast(op.Constant(value_int=4), to=2), direction="RIGHT")
    ax = op.Constant(value_ints=[3])
    pairs = op.Concat(op.Unsqueeze(low, ax), op.Unsqueeze(high, ax), axis=3)  # [E, N, K2, 2]
    flat = op.Reshape(pairs, op.Constant(value_ints=[0, 0, -1]))
    nib = op.Cast(op.Slice(flat, op.Constant(value_ints=[0]), op.Constant(value_ints=[K]),
                           op.Constant(value_ints=[2])), to=3)
    signed = op.Where(op.GreaterOrEqual(nib, op.Cast(op.Constant(value_int=8), to=3)),
                      op.Sub(nib, op.Cast(op.Constant(value_int=16), to=3)), nib)
    return op.Cast(signed, to=INT4)


def moe_int4_translation(hidden, router_logits, gate_up, gate_up_scale, down, down_scale, top_k, norm_topk_prob,
                         group_size):
    op = _op()
    H = hidden.shape[-1] if isinstance(hidden.shape[-1], int) else gate_up.shape[2] * 2
    I = gate_up.shape[1] // 2
    G = int(group_size)
    gu = _dequantize(op, _unpack_int4(op, gate_up, H), gate_up_scale, H, G, hidden)
    dn = _dequantize(op, _unpack_int4(op, down, I), down_scale, I, G, hidden)
    return moe_onnx.translation(hidden, router_logits, gu, dn, top_k, norm_topk_prob)


def fold_int4_expert_weights(ir_model) -> int:
    """Replace each rank-3 INT4 expert weight computed from a packed uint8 initializer (the
    `_unpack_int4` chain) by one INT4 [E, N, K] initializer feeding its DequantizeLinear; drop the
    dead nodes. Returns how many weights were folded."""

    def plan(w):
        if w.shape is None or len(w.shape) != 3 or not all(isinstance(d, int) for d in w.shape):
            return None
        E, N, K = w.shape

        def is_source(v):  # [E, N, ceil(K/2)] bytes or [E, N, ceil(K/2), 2] nibble pairs
            return v.shape is not None and len(v.shape) in (3, 4) and v.shape[0] == E and v.shape[1] == N

        return is_source, lambda a: signed_int4(a, (E, N), K)

    return fold_int4_chains(ir_model, plan)


def translations() -> dict:
    """{torch op overload: onnxscript translation} for the dynamo exporter."""
    import torch

    import gdn_export.ops.moe_quant  # noqa: F401  (registers the ops)

    return {torch.ops.gdn.moe_fp8.default: moe_fp8_translation,
            torch.ops.gdn.moe_int4.default: moe_int4_translation}
