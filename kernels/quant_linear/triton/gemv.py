"""Triton GEMV (one row of x) for the three quantized-linear formats: CUDA-core products, no tensor-core
layouts. Each program reads a [BN, BK] weight tile along K (16-byte loads of fp8, 8-byte of packed
int4), widens it to fp32 in registers, multiplies by x's row (quantized in the tile for the fp8
forms, exactly as the contract), reduces along K, and splits K over programs (partials finished
in the same launch: each program of a split stores its partial, and the last one to arrive, counted
by an atomic per column tile, sums them, scales and stores y, then resets its counter to 0: one
kernel a call, no finishing launch). fp32 products of e4m3 or int4 values are exact, so only the fp32
summation order differs from the reference.

Used by gpu.py for M = 1 when triton_common.GEMV is set (off: docs/perf/quant_linear.md's launch sweep
found no configuration under 0.8x bf16 on every shape).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.quant_linear.triton import common
from kernels.quant_linear.triton.common import SOFT_FP8, device_sms, finish_split, quantize_activation
from kernels.triton_utils import cdiv

FP8_TENSOR, FP8_BLOCK, INT4 = 0, 1, 2
# Launch: BN columns x BK of K a tile, split K towards per_sm programs a multiprocessor (the sweep of
# docs/perf/quant_linear.md, H200 2026-12-03).
CFG = dict(BN=32, BK=128, warps=4, stages=2, per_sm=4)


@triton.jit
def gemv_kernel(x, w, ws, s_in, bias, y, part, counter, N, K, KH, G, SPLIT, TILES_PER_SPLIT, FMT: tl.constexpr,
                GS: tl.constexpr, EXACT: tl.constexpr, SOFT: tl.constexpr, PARTIAL: tl.constexpr,
                HAS_BIAS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    i_n, i_s = tl.program_id(0), tl.program_id(1)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < N
    r_n = tl.arange(0, BN)
    b_acc = tl.zeros([BN], dtype=tl.float32)
    if FMT == 0:
        s = tl.load(s_in)
    t0 = i_s * TILES_PER_SPLIT
    t1 = tl.minimum(t0 + TILES_PER_SPLIT, tl.cdiv(K, BK))
    for t in range(t0, t1):
        o_k = t * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_x = tl.load(x + o_k, mask=m_k, other=0.0).to(tl.float32)
        if FMT == 2:
            o_h = t * (BK // 2) + tl.arange(0, BK // 2)
            p_q = w + (i_n * BN).to(tl.int64) * KH
            b_q = tl.load(p_q + r_n[:, None] * KH + o_h[None, :], mask=m_n[:, None] & (o_h < KH)[None, :], other=0)
            b_lo = ((b_q << 4).to(tl.int8, bitcast=True) >> 4).to(tl.float32)
            b_hi = (b_q.to(tl.int8, bitcast=True) >> 4).to(tl.float32)
            b_w = tl.interleave(b_lo, b_hi)
            b_sc = tl.load(ws + o_n.to(tl.int64) * G + (t * BK) // GS, mask=m_n, other=0.0).to(tl.float32)
            b_acc += tl.sum(b_w * b_x[None, :], axis=1) * b_sc
        else:
            p_w = w + (i_n * BN).to(tl.int64) * K
            b_w = tl.load(p_w + r_n[:, None] * K + o_k[None, :], mask=m_n[:, None] & m_k[None, :],
                          other=0.0).to(tl.float32)
            if FMT == 1:
                sg = tl.max(tl.abs(b_x), axis=0)
                sg = tl.math.div_rn(tl.maximum(sg, 1e-10), 448.0)
            else:
                sg = s
            q = quantize_activation(b_x, sg, EXACT, SOFT).to(tl.float32)
            b_d = tl.sum(b_w * q[None, :], axis=1)
            if FMT == 1:
                b_wsc = tl.load(ws + (o_n // 128) * G + t, mask=m_n, other=0.0)
                b_acc += b_d * sg * b_wsc
            else:
                b_acc += b_d
    b_acc, last = finish_split(b_acc, part, counter, i_n, i_s, SPLIT, N, o_n, m_n, PARTIAL)
    if last:
        _store_y(b_acc, o_n, m_n, ws, s_in, bias, y, FMT, HAS_BIAS)


@triton.jit
def _store_y(b_acc, o_n, m_n, ws, s_in, bias, y, FMT: tl.constexpr, HAS_BIAS: tl.constexpr):
    if FMT == 0:
        b_acc = b_acc * (tl.load(s_in) * tl.load(ws + o_n, mask=m_n, other=0.0))
    if HAS_BIAS:
        b_acc += tl.load(bias + o_n, mask=m_n, other=0.0).to(tl.float32)
    tl.store(y + o_n, b_acc.to(y.dtype.element_ty), mask=m_n)


def gemv(fmt: int, x2: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, s_in=None, bias=None, group_size: int = 128):
    """y [1, N] for x2 [1, K] (unit column stride): fmt FP8_TENSOR (w [N, K] e4m3, ws [N] fp32, s_in []),
    FP8_BLOCK (ws [ceil(N/128), ceil(K/128)] fp32) or INT4 (w [N, ceil(K/2)] uint8, ws = scales
    [N, ceil(K/group_size)], group_size a multiple of 128); contiguous weights and scales."""
    M, K = x2.shape
    if M != 1:
        raise ValueError(f"gemv: x must have one row, got {M}")
    N = w.shape[0]
    BN, BK = CFG["BN"], CFG["BK"]
    if fmt == INT4 and group_size % BK:
        raise ValueError(f"gemv: int4 group_size {group_size} must be a multiple of the K tile {BK}")
    if fmt == FP8_BLOCK and BK != 128:
        raise ValueError(f"gemv: the 128-block fp8 form needs a K tile of 128, got {BK}")
    y = common.empty(1, N, dtype=x2.dtype, device=x2.device)
    k_tiles = cdiv(K, BK)
    split = max(1, min(k_tiles, round(CFG["per_sm"] * device_sms(x2) / cdiv(N, BN))))
    per = cdiv(k_tiles, split)
    split = cdiv(k_tiles, per)
    part = common.empty(split, 1, N, dtype=torch.float32, device=x2.device) if split > 1 else y
    G = ws.shape[1] if fmt != FP8_TENSOR else 1
    counter = common.counters(x2.device, cdiv(N, BN)) if split > 1 else ws
    gemv_kernel[(cdiv(N, BN), split)](
        x2, w, ws, s_in if s_in is not None else ws, bias if bias is not None else ws, y, part, counter, N, K,
        w.shape[1], G, split, per, FMT=fmt, GS=group_size, EXACT=True, SOFT=SOFT_FP8,
        PARTIAL=split > 1, HAS_BIAS=bias is not None, BN=BN, BK=BK, num_warps=CFG["warps"], num_stages=CFG["stages"])
    return y
