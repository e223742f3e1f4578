"""Triton kernels of the quantized routed experts (gdn::moe_fp8, gdn::moe_int4; contract in quant.py).

The routing and the row-block schedule are those of the 16-bit kernels (kernels.moe.triton.moe:
`route`, `_expert_block`); the gate_up and down kernels read the expert weights in their
stored form, FP8 E4M3 bytes or packed INT4 nibbles, so only the quantized bytes and their scales
cross memory. Where a K tile lies in one scale group (per-channel scales, or groups the tile
divides: the K tile narrows to a group of 32 or 64), the stored values are the dot's operands (e4m3
and int4 values are exact in 16 bits; INT4 converted by triton_utils.int4_nibbles, the low nibbles
dotted with the activations' even columns and the high ones with the odd ones) and the scales a
column factor of the fp32 product; otherwise each [BK, BN] tile is dequantized in registers
(weight * scale of its row and K group) before the dot. With static FP8 activation scales, each row tile of the expert's tokens is rounded to
e4m3 by that expert's scale (clamp to +-448, round to nearest even) before the dot, as the contract's
fake quantization says. fp32 inputs use IEEE fp32 dots; fp16 / bf16 inputs dot in their dtype with
fp32 accumulation (under the CPU interpreter, whose fp32 -> bf16 conversion truncates, the
dequantized tiles stay fp32: `UPCAST_DOT` widens every dot there anyway; the act and per-pair
output stores round to nearest even by hand, `to_state_dtype`, as the GPU's conversion does).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import triton_utils
from kernels.moe.triton.moe import _expert_block, route
from kernels.triton_utils import UPCAST_DOT, cdiv, dot, int4_nibbles, to_state_dtype

FP8, INT4 = 0, 1


@triton.jit
def _weight_tile(p_rows, p_scale, o_k, m_w, GS, QUANT: tl.constexpr):
    # p_rows [1, BN]: each output row's first weight element (fp8) or byte (int4); p_scale [1, BN]: each
    # row's first scale; o_k [BK]. -> fp32 [BK, BN] dequantized tile.
    if QUANT == 0:
        b_q = tl.load(p_rows + o_k[:, None], mask=m_w, other=0.0).to(tl.float32)
    else:
        b_b = tl.load(p_rows + (o_k // 2)[:, None], mask=m_w, other=0).to(tl.int32)
        b_n = (b_b >> ((o_k % 2) * 4)[:, None]) & 15
        b_q = tl.where(b_n >= 8, b_n - 16, b_n).to(tl.float32)
    b_s = tl.load(p_scale + (o_k // GS)[:, None], mask=m_w, other=0.0).to(tl.float32)
    return b_q * b_s


@triton.jit
def _tile_product(b_x, p_rows, p_scale, k0, KD, W_ROW, m_n, GS, dt: tl.constexpr, QUANT: tl.constexpr,
                  IN_GROUP: tl.constexpr, PTX: tl.constexpr, IEEE: tl.constexpr, BM: tl.constexpr,
                  BK: tl.constexpr):
    # b_x [BM, BK] (columns k0 .. k0 + BK of the KD-wide input, in dt: the activation dtype on the GPU,
    # fp32 under the interpreter or for fp32 inputs) times the dequantized weight tile of the rows p_rows
    # [1, BN] (scales p_scale [1, BN]) -> fp32 [BM, BN].
    # IN_GROUP (the K tile lies in one scale group): the stored values are the dot's operands (e4m3 and
    # int4 values are exact in 16 bits) and the scales a column factor of the fp32 product; INT4 as two
    # dots, low nibbles against x's even columns and high nibbles against its odd ones
    # (triton_utils.int4_nibbles). Otherwise each element is dequantized first (_weight_tile).
    o_k = k0 + tl.arange(0, BK)
    m_k = o_k < KD
    if IN_GROUP:
        b_s = tl.load(p_scale + k0 // GS, mask=m_n, other=0.0).to(tl.float32)
        if QUANT == 0:
            b_w = tl.load(p_rows + o_k[:, None], mask=m_k[:, None] & m_n, other=0.0).to(dt)
            b_d = dot(b_x, b_w, IEEE)
        else:
            o_h = k0 // 2 + tl.arange(0, BK // 2)
            b_q = tl.load(p_rows + o_h[:, None], mask=(o_h < W_ROW)[:, None] & m_n, other=0)
            b_lo, b_hi = int4_nibbles(b_q, dt, UPCAST_DOT, PTX)
            b_xe, b_xo = tl.split(tl.reshape(b_x, [BM, BK // 2, 2]))
            b_d = dot(b_xe, b_lo, IEEE) + dot(b_xo, b_hi, IEEE)
        return b_d * b_s
    else:
        b_w = _weight_tile(p_rows, p_scale, o_k, m_k[:, None] & m_n, GS, QUANT)
        return dot(b_x, b_w.to(dt), IEEE)


@triton.jit
def _fake_fp8(b_x, s):
    # fp32 tile -> e4m3(clamp(x / s, -448, 448)) * s in fp32. The e4m3 rounding (to nearest even, 3
    # mantissa bits, subnormals below 2^-6 in steps of 2^-9) is done in fp32 arithmetic: exact, and
    # the same under the CPU interpreter, whose float8 conversion does not round to nearest even.
    b_v = tl.minimum(tl.maximum(b_x / s, -448.0), 448.0)
    b_e = ((b_v.to(tl.int32, bitcast=True) >> 23) & 255) - 127  # unbiased exponent of |v|
    b_step = ((tl.maximum(b_e, -6) - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 2^(e - 3)
    b_q = b_v / b_step  # |q| < 16, exact
    b_q = (b_q + 12582912.0) - 12582912.0  # 1.5 * 2^23: fp32 addition rounds q to an integer, ties to even
    return b_q * b_step * s


@triton.jit
def moe_q_gate_up_kernel(x, gate_up, scale, in_scale, rows, counts, act, N, H, I, E, W_ROW, G, GS,
                         K: tl.constexpr, BE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                         BK: tl.constexpr, QUANT: tl.constexpr, STATIC: tl.constexpr, IEEE: tl.constexpr,
                         IN_GROUP: tl.constexpr, PTX: tl.constexpr):
    i_b, i_i = tl.program_id(0), tl.program_id(1)
    i_e, r0 = _expert_block(counts, E, i_b, BE, BM)
    if i_e < E:
        o_m = r0 + tl.arange(0, BM)
        m_m = o_m < tl.load(counts + i_e)
        b_pair = tl.load(rows + i_e.to(tl.int64) * N + o_m, mask=m_m, other=0)
        p_x = x + (b_pair // K).to(tl.int64)[:, None] * H
        o_n = i_i * BN + tl.arange(0, BN)
        m_n = o_n < I
        row_g = i_e.to(tl.int64) * 2 * I + o_n[None, :].to(tl.int64)  # gate rows; up rows are + I
        p_g, p_u = gate_up + row_g * W_ROW, gate_up + (row_g + I) * W_ROW
        s_g, s_u = scale + row_g * G, scale + (row_g + I) * G
        if STATIC:
            s_in = tl.load(in_scale + i_e)
        b_g = tl.zeros([BM, BN], dtype=tl.float32)
        b_u = tl.zeros([BM, BN], dtype=tl.float32)
        # the dot's operand dtype: the activation's on the GPU (tensor cores), fp32 under the interpreter
        dt: tl.constexpr = tl.float32 if UPCAST_DOT else act.dtype.element_ty
        for k0 in range(0, H, BK):
            o_k = k0 + tl.arange(0, BK)
            m_k = o_k < H
            b_x = tl.load(p_x + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0)
            if STATIC:
                b_x = _fake_fp8(b_x.to(tl.float32), s_in)
            b_x = b_x.to(dt)
            b_g += _tile_product(b_x, p_g, s_g, k0, H, W_ROW, m_n[None, :], GS, dt, QUANT, IN_GROUP, PTX, IEEE, BM, BK)
            b_u += _tile_product(b_x, p_u, s_u, k0, H, W_ROW, m_n[None, :], GS, dt, QUANT, IN_GROUP, PTX, IEEE, BM, BK)
        b_a = b_g * tl.sigmoid(b_g) * b_u
        if STATIC:  # the down projection's input, rounded by this expert's down scale (in fp32)
            b_a = _fake_fp8(b_a, tl.load(in_scale + E + i_e))
        tl.store(act + b_pair.to(tl.int64)[:, None] * I + o_n[None, :], to_state_dtype(b_a, act.dtype.element_ty),
                 mask=m_m[:, None] & m_n[None, :])


@triton.jit
def moe_q_down_kernel(act, down, scale, weights, rows, counts, y, N, H, I, E, W_ROW, G, GS,
                      BE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      QUANT: tl.constexpr, IEEE: tl.constexpr, IN_GROUP: tl.constexpr, PTX: tl.constexpr):
    i_b, i_h = tl.program_id(0), tl.program_id(1)
    i_e, r0 = _expert_block(counts, E, i_b, BE, BM)
    if i_e < E:
        o_m = r0 + tl.arange(0, BM)
        m_m = o_m < tl.load(counts + i_e)
        b_pair = tl.load(rows + i_e.to(tl.int64) * N + o_m, mask=m_m, other=0).to(tl.int64)
        o_n = i_h * BN + tl.arange(0, BN)
        m_n = o_n < H
        row = i_e.to(tl.int64) * H + o_n[None, :].to(tl.int64)
        p_d, s_d = down + row * W_ROW, scale + row * G
        b_y = tl.zeros([BM, BN], dtype=tl.float32)
        dt: tl.constexpr = tl.float32 if UPCAST_DOT else act.dtype.element_ty
        for k0 in range(0, I, BK):
            o_k = k0 + tl.arange(0, BK)
            m_k = o_k < I
            b_a = tl.load(act + b_pair[:, None] * I + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0)
            b_y += _tile_product(b_a.to(dt), p_d, s_d, k0, I, W_ROW, m_n[None, :], GS, dt, QUANT, IN_GROUP, PTX, IEEE,
                                 BM, BK)
        b_y *= tl.load(weights + b_pair, mask=m_m, other=0)[:, None]
        tl.store(y + b_pair[:, None] * H + o_n[None, :], to_state_dtype(b_y, y.dtype.element_ty),
                 mask=m_m[:, None] & m_n[None, :])


def _k_tile(scale: torch.Tensor, group_size: int, BK: int) -> tuple[int, bool]:
    """(K tile, whether every tile lies in one scale group): BK where one group spans a row or BK divides
    the group, else the largest power of two down to 32 that divides it (32-wide groups of a 128-wide
    tile), else BK and the per-element path."""
    if scale.shape[2] == 1:
        return BK, True
    bk = BK
    while group_size % bk and bk > 32:
        bk //= 2
    return (bk, True) if group_size % bk == 0 else (BK, False)


def _run(hidden, router_logits, gate_up, gate_up_scale, down, down_scale, in_scales, top_k, norm_topk_prob,
         quant: int, gs1: int, gs2: int):
    N, H = hidden.shape
    E, I = gate_up.shape[0], gate_up.shape[1] // 2
    dtype = hidden.dtype
    x = hidden.contiguous()
    gate_up, down = gate_up.contiguous(), down.contiguous()
    gate_up_scale, down_scale = gate_up_scale.contiguous(), down_scale.contiguous()
    r = route(router_logits, top_k, norm_topk_prob, H, I, dtype)
    weights, rows, counts, act, y = r.weights, r.rows, r.counts, r.act, r.y
    if N > 0:
        BE, t, blocks = r.BE, r.tiles, r.blocks
        ieee = dtype == torch.float32
        static = in_scales is not None
        ptx = triton_utils.NIBBLE_PTX
        # INT4 splits a K tile into even and odd halves, each a dot operand of K >= 16: BK >= 32.
        min_bk = 32 if quant == INT4 else 16
        bk1, in1 = _k_tile(gate_up_scale, gs1, max(t["BK1"], min_bk))
        bk2, in2 = _k_tile(down_scale, gs2, max(t["BK2"], min_bk))
        moe_q_gate_up_kernel[(blocks, cdiv(I, t["BN1"]))](
            x, gate_up, gate_up_scale, in_scales if static else weights, rows, counts, act, N, H, I, E,
            gate_up.shape[2], gate_up_scale.shape[2], gs1, K=top_k, BE=BE, BM=t["BM"], BN=t["BN1"],
            BK=bk1, QUANT=quant, STATIC=static, IEEE=ieee, IN_GROUP=in1, PTX=ptx, num_warps=4,
            num_stages=t["stages"])
        moe_q_down_kernel[(blocks, cdiv(H, t["BN2"]))](
            act, down, down_scale, weights, rows, counts, y, N, H, I, E, down.shape[2], down_scale.shape[2], gs2,
            BE=BE, BM=t["BM"], BN=t["BN2"], BK=bk2, QUANT=quant, IEEE=ieee, IN_GROUP=in2, PTX=ptx, num_warps=4,
            num_stages=t["stages"])
    return y.view(N, top_k, H).sum(1, dtype=torch.float32).to(hidden.dtype)


def moe_fp8(hidden, router_logits, gate_up, gate_up_scale, down, down_scale, gate_up_input_scale=None,
            down_input_scale=None, top_k: int = 1, norm_topk_prob: bool = True) -> torch.Tensor:
    """gdn::moe_fp8 on CUDA (or the Triton interpreter): hidden [N, H] -> out [N, H] (see quant.py)."""
    H, I = hidden.shape[1], down.shape[2]
    in_scales = None
    if gate_up_input_scale is not None:
        in_scales = torch.cat((gate_up_input_scale.float().reshape(-1), down_input_scale.float().reshape(-1)))
    gs1 = H if gate_up_scale.shape[2] == 1 else 128
    gs2 = I if down_scale.shape[2] == 1 else 128
    return _run(hidden, router_logits, gate_up, gate_up_scale, down, down_scale, in_scales, top_k,
                norm_topk_prob, FP8, gs1, gs2)


def moe_int4(hidden, router_logits, gate_up, gate_up_scale, down, down_scale, top_k: int = 1,
             norm_topk_prob: bool = True, group_size: int = 128) -> torch.Tensor:
    """gdn::moe_int4 on CUDA (or the Triton interpreter): hidden [N, H] -> out [N, H] (see quant.py)."""
    return _run(hidden, router_logits, gate_up, gate_up_scale, down, down_scale, None, top_k, norm_topk_prob,
                INT4, group_size, group_size)
