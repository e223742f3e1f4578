"""Triton kernels of the FP8 linear ops (contract: gdn_export/ops/quant_linear/__init__.py).

- quant_tensor_kernel: x [M, K] -> e4m3(clamp(x / input_scale)) [M, K] and the [M, 1] row scale that
  torch._scaled_mm's rowwise form wants (per-tensor activations, fp8_linear's prefill).
- quant_group_kernel: x [M, K] -> per-token groups of 128: s[m, g] = max(amax, 1e-10) / 448,
  e4m3(x / s) (fp8_block_linear's prefill).
- fp8_gemm_kernel: y = x_q @ W^T with the scales, for both forms; skinny launches (decode, M <= 32)
  quantize x inside each tile and may split K (partials summed in the same launch by the last program of each tile),
  prefill launches of the block form read the pre-quantized x.

Division: x / s correctly rounded (div_rn), the contract's quotient bit for bit; x * (1 / s) would
move elements next to an e4m3 rounding tie to the other neighbour (frequent for 16-bit x over a scale
made from 16-bit values; see skinny.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.quant_linear.triton.common import (
    E4M3_MAX, SKINNY_M, SOFT_FP8, UPCAST, device_sms, exact_dot, finish_split, group_scale, grouped_tile,
    quantize_activation, skinny_block_m, split_k)
from kernels.quant_linear.triton import common
from kernels.triton_utils import cdiv, next_pow2, to_state_dtype

GROUP = 128  # block size of the fine-grained format, both dims
# Elements a quant_tensor_kernel program holds (rows x up to 1024 columns). With one row a program it
# took 1.41 ms for the 96 calls of a 4096-token 1.66B prefill on an H100 (14.7 us each); silu * up's
# 4-row x 1024 tiles move 2.8 TB/s on that prefill's [4096, 6144] halves.
QUANT_TILE = 4096


@triton.jit
def quant_tensor_kernel(x, xq, row_scale, s_in, M, K, stride_xm, EXACT: tl.constexpr, SOFT: tl.constexpr,
                        BM: tl.constexpr, BK: tl.constexpr):
    """Program (BM rows, BK columns) of x [M, K]: e4m3(clamp(x / s_in)); the first column tile also
    writes the rows' scale."""
    i_m, i_k = tl.program_id(0), tl.program_id(1)
    o_m = i_m * BM + tl.arange(0, BM)
    o_k = i_k * BK + tl.arange(0, BK)
    m_x = (o_m < M)[:, None] & (o_k < K)[None, :]
    r64 = o_m.to(tl.int64)[:, None]
    s = tl.load(s_in)
    b_x = tl.load(x + r64 * stride_xm + o_k[None, :], mask=m_x, other=0.0).to(tl.float32)
    tl.store(xq + r64 * K + o_k[None, :], quantize_activation(b_x, s, EXACT, SOFT), mask=m_x)
    if i_k == 0:
        tl.store(row_scale + o_m, tl.zeros([BM], tl.float32) + s, mask=o_m < M)


@triton.jit
def quant_group_kernel(x, xq, xs, M, K, KB, stride_xm, EXACT: tl.constexpr, SOFT: tl.constexpr,
                       G: tl.constexpr):
    """Program (row m, G groups): x[m, 128 g : 128 g + 128] for G consecutive groups as a [G, 128] tile."""
    i_m, i_g = tl.program_id(0), tl.program_id(1)
    o_g = i_g * G + tl.arange(0, G)
    o_k = o_g[:, None] * 128 + tl.arange(0, 128)[None, :]
    m_k = o_k < K
    b_x = tl.load(x + i_m.to(tl.int64) * stride_xm + o_k, mask=m_k, other=0.0).to(tl.float32)
    s = group_scale(b_x)
    tl.store(xq + i_m.to(tl.int64) * K + o_k, quantize_activation(b_x, s[:, None], EXACT, SOFT), mask=m_k)
    tl.store(xs + o_g.to(tl.int64) * M + i_m, s, mask=o_g < KB)  # M-major [KB, M]


@triton.jit
def fp8_gemm_kernel(x, xs, w, ws, s_in, bias, y, part, counter, M, N, K, KB, stride_xm, SPLIT, TILES_PER_SPLIT,
                    BLOCKWISE: tl.constexpr, X_FP8: tl.constexpr, DOT_FP8: tl.constexpr,
                    EXACT: tl.constexpr, SOFT: tl.constexpr, UP: tl.constexpr, PARTIAL: tl.constexpr,
                    HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    GROUP_M: tl.constexpr):
    """One [BM, BN] tile of y over K tiles [TILES_PER_SPLIT * i_s, ...) of BK.

    BLOCKWISE: w's scale is ws [ceil(N/128), KB] per 128 x 128 block and x's is per token and
    128-group (BK = 128: one group a K tile), applied to each tile's fp32 product; else ws [N] and the
    per-tensor s_in, applied once at the end. X_FP8: x is already e4m3 with scales xs stored M-major ([KB, M])
    (blockwise only); else x is quantized here. DOT_FP8: fp8 x fp8 tensor-core products, else the fp8
    values widened to bf16 (exact) for a bf16 dot with fp32 accumulation.
    """
    i_mn, i_s = tl.program_id(0), tl.program_id(1)
    i_m, i_n = grouped_tile(i_mn, M, N, BM, BN, GROUP_M)

    o_m = i_m * BM + tl.arange(0, BM)
    o_n = i_n * BN + tl.arange(0, BN)
    m_m, m_n = o_m < M, o_n < N
    o_m64, o_n64 = o_m.to(tl.int64), o_n.to(tl.int64)
    # tile bases in int64, in-tile offsets in int32 (64-bit offset tensors cost registers and spill)
    r_m, r_n = tl.arange(0, BM), tl.arange(0, BN)
    p_x = x + (i_m * BM).to(tl.int64) * (K if X_FP8 else stride_xm)
    p_w = w + (i_n * BN).to(tl.int64) * K
    if not BLOCKWISE:
        s = tl.load(s_in)
    b_acc = tl.zeros([BM, BN], dtype=tl.float32)
    if BLOCKWISE and not X_FP8:
        tl.static_assert(BK == 128, "x quantized in the tile needs whole 128-groups")
    t0 = i_s * TILES_PER_SPLIT
    t1 = tl.minimum(t0 + TILES_PER_SPLIT, tl.cdiv(K, BK))
    for t in range(t0, t1):
        o_k = t * BK + tl.arange(0, BK)
        m_k = o_k < K
        g = (t * BK) // 128  # the 128-group of this K tile (BK divides 128)
        b_w = tl.load(p_w + r_n[None, :] * K + o_k[:, None], mask=m_n[None, :] & m_k[:, None], other=0.0)
        if X_FP8:
            b_a = tl.load(p_x + r_m[:, None] * K + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0.0)
            b_s = tl.load(xs + g.to(tl.int64) * M + o_m64, mask=m_m, other=0.0)
        else:
            b_x = tl.load(p_x + r_m[:, None] * stride_xm + o_k[None, :], mask=m_m[:, None] & m_k[None, :],
                          other=0.0).to(tl.float32)
            if BLOCKWISE:
                b_s = group_scale(b_x)
                b_a = quantize_activation(b_x, b_s[:, None], EXACT, SOFT)
            else:
                b_a = quantize_activation(b_x, s, EXACT, SOFT)
        if DOT_FP8:
            b_d = tl.dot(b_a, b_w)
        else:
            b_d = exact_dot(b_a.to(tl.bfloat16), b_w.to(tl.bfloat16), UP)
        if BLOCKWISE:
            b_ws = tl.load(ws + (o_n // 128) * KB + g, mask=m_n, other=0.0)
            b_acc += b_d * b_s[:, None] * b_ws[None, :]
        else:
            b_acc += b_d
    mask = m_m[:, None] & m_n[None, :]
    o_y = o_m64[:, None] * N + o_n64[None, :]
    b_acc, last = finish_split(b_acc, part, counter, i_mn, i_s, SPLIT, M * N, o_y, mask, PARTIAL)
    if last:
        if not BLOCKWISE:
            b_acc = b_acc * (s * tl.load(ws + o_n, mask=m_n, other=0.0))[None, :]
        if HAS_BIAS:
            b_acc += tl.load(bias + o_n, mask=m_n, other=0.0).to(tl.float32)[None, :]
        tl.store(y + o_y, to_state_dtype(b_acc, y.dtype.element_ty), mask=mask)


def quantize_tensor(x2: torch.Tensor, input_scale: torch.Tensor):
    """x2 [M, K] -> (x_q [M, K] float8_e4m3fn, row scale [M, 1] fp32 = input_scale per row)."""
    M, K = x2.shape
    xq = common.empty(M, K, dtype=torch.float8_e4m3fn, device=x2.device)
    rs = common.empty(M, 1, dtype=torch.float32, device=x2.device)
    BK = min(1024, next_pow2(K))
    BM = max(1, min(QUANT_TILE // BK, next_pow2(M)))
    if M:
        quant_tensor_kernel[(cdiv(M, BM), cdiv(K, BK))](x2, xq, rs, input_scale, M, K, x2.stride(0),
                                                        EXACT=True, SOFT=SOFT_FP8, BM=BM, BK=BK,
                                                        num_warps=4)
    return xq, rs


def quantize_groups(x2: torch.Tensor):
    """x2 [M, K] -> (x_q [M, K] float8_e4m3fn, scales [M, ceil(K/128)] fp32), per token and group of 128.
    The scales are M-major (strides (1, M)), the layout torch._scaled_mm's 1x128 blockwise form takes."""
    M, K = x2.shape
    KB = cdiv(K, GROUP)
    xq = common.empty(M, K, dtype=torch.float8_e4m3fn, device=x2.device)
    xs = common.empty(KB, M, dtype=torch.float32, device=x2.device)
    G = min(16, next_pow2(KB))
    if M:
        quant_group_kernel[(M, cdiv(KB, G))](x2, xq, xs, M, K, KB, x2.stride(0),
                                             EXACT=True, SOFT=SOFT_FP8, G=G,
                                             num_warps=4)
    return xq, xs.t()


def fp8_gemm(x2, weight, ws, s_in=None, bias=None, out_dtype=None, blockwise=False):
    """y [M, N] = the contract's fp8_linear (blockwise=False: ws [N], s_in []) or fp8_block_linear
    (blockwise=True: ws [ceil(N/128), ceil(K/128)]) on x2 [M, K] (fp32 / fp16 / bf16, unit column
    stride), weight [N, K] float8_e4m3fn contiguous; bias [N] or None; y in out_dtype (x2's)."""
    M, K = x2.shape
    N = weight.shape[0]
    out_dtype = out_dtype or x2.dtype
    y = common.empty(M, N, dtype=out_dtype, device=x2.device)
    if M == 0:
        return y
    KB = cdiv(K, GROUP)
    exact = x2.dtype == torch.float32
    if M <= SKINNY_M:
        BM, BN, BK = skinny_block_m(M), common.SKINNY["BN"], 128
        tiles = cdiv(M, BM) * cdiv(N, BN)
        k_tiles = cdiv(K, BK)
        split = split_k(tiles, k_tiles, device_sms(x2))
        per = cdiv(k_tiles, split)
        split = cdiv(k_tiles, per)
        x_in, xs, x_fp8, dot_fp8 = x2, x2, False, False
        warps, stages = common.SKINNY["warps"], common.SKINNY["stages"]
    else:
        split, per = 1, cdiv(K, 64)
        if blockwise:
            x_in, xs = quantize_groups(x2)
            x_fp8, dot_fp8 = True, not exact
        else:
            x_in, xs, x_fp8, dot_fp8 = x2, x2, False, False
        BM, BN, BK = (128, 128, 64) if dot_fp8 else (64, 128, 64)
        warps, stages = 8, (4 if dot_fp8 else 2)
        tiles = cdiv(M, BM) * cdiv(N, BN)
    part = common.empty(split, M, N, dtype=torch.float32, device=x2.device) if split > 1 else y
    fp8_gemm_kernel[(tiles, split)](
        x_in, xs, weight, ws, s_in if s_in is not None else ws, bias if bias is not None else ws, y, part,
        common.counters(x2.device, tiles) if split > 1 else ws, M, N, K, KB, x_in.stride(0), split, per, BLOCKWISE=blockwise, X_FP8=x_fp8, DOT_FP8=dot_fp8, EXACT=True,
        SOFT=SOFT_FP8, UP=UPCAST, PARTIAL=split > 1, HAS_BIAS=bias is not None, BM=BM, BN=BN, BK=BK, GROUP_M=8,
        num_warps=warps, num_stages=stages)
    return y


__all__ = ["E4M3_MAX", "GROUP", "fp8_gemm", "quantize_groups", "quantize_tensor"]
