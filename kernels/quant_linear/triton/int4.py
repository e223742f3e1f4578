"""Triton kernel of the W4A16 linear op (contract: gdn_export/ops/quant_linear/__init__.py, int4_linear).

qweight [N, ceil(K/2)] uint8 holds int4 (n, k) at byte k // 2, low nibble for even k, high for odd,
two's complement; scales [N, ceil(K/group_size)]. int4_dequant (the prefill's pass) converts the
nibbles by magic-number arithmetic in registers (triton_utils.int4_nibbles). The GEMM's tiles unpack
[BN, BK/2] bytes into [BN, BK] int4 values in registers (sign-extended by shifts, interleaved low /
high), widened to x's dtype (exact), one tensor-core dot with x's [BM, BK] tile in fp32
accumulation, then the group's scale per column (BK divides group_size, so a K tile lies in one
group): y = sum_g scale[n, g] * (x . int4).
Skinny launches (decode, M <= 32) split K across programs (partials summed in the same launch by
the last program of each tile) so that the weight stream fills the GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.quant_linear.triton.common import (
    SKINNY_M, UPCAST, device_sms, exact_dot, finish_split, grouped_tile, skinny_block_m, split_k)
from kernels.quant_linear.triton import common
from kernels import triton_utils
from kernels.triton_utils import cdiv, int4_nibbles, next_pow2, to_state_dtype


@triton.jit
def int4_gemm_kernel(x, qw, sc, bias, y, part, counter, M, N, K, KH, G, stride_xm, SPLIT, TILES_PER_SPLIT,
                     GS: tl.constexpr, UP: tl.constexpr, PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    i_mn, i_s = tl.program_id(0), tl.program_id(1)
    i_m, i_n = grouped_tile(i_mn, M, N, BM, BN, GROUP_M)

    o_m = i_m * BM + tl.arange(0, BM)
    o_n = i_n * BN + tl.arange(0, BN)
    m_m, m_n = o_m < M, o_n < N
    o_m64, o_n64 = o_m.to(tl.int64), o_n.to(tl.int64)
    r_m, r_n = tl.arange(0, BM), tl.arange(0, BN)
    p_x = x + (i_m * BM).to(tl.int64) * stride_xm
    p_q = qw + (i_n * BN).to(tl.int64) * KH
    cdt = x.dtype.element_ty
    b_acc = tl.zeros([BM, BN], dtype=tl.float32)
    t0 = i_s * TILES_PER_SPLIT
    t1 = tl.minimum(t0 + TILES_PER_SPLIT, tl.cdiv(K, BK))
    for t in range(t0, t1):
        o_k = t * BK + tl.arange(0, BK)
        o_h = t * (BK // 2) + tl.arange(0, BK // 2)
        b_x = tl.load(p_x + r_m[:, None] * stride_xm + o_k[None, :], mask=m_m[:, None] & (o_k < K)[None, :],
                      other=0.0)
        b_q = tl.load(p_q + r_n[:, None] * KH + o_h[None, :], mask=m_n[:, None] & (o_h < KH)[None, :],
                      other=0)
        b_lo = (b_q << 4).to(tl.int8, bitcast=True) >> 4
        b_hi = b_q.to(tl.int8, bitcast=True) >> 4
        b_w = tl.interleave(b_lo, b_hi)  # [BN, BK], column k = 2 j + (0 low, 1 high)
        # (the interpreter's int8 -> bf16 cast yields NaN: widen to fp32 there)
        if UP:
            b_w = b_w.to(tl.float32)
        else:
            b_w = b_w.to(cdt)
        b_d = exact_dot(b_x, tl.trans(b_w), UP)
        b_s = tl.load(sc + o_n64 * G + (t * BK) // GS, mask=m_n, other=0.0).to(tl.float32)
        b_acc += b_d * b_s[None, :]
    mask = m_m[:, None] & m_n[None, :]
    o_y = o_m64[:, None] * N + o_n64[None, :]
    b_acc, last = finish_split(b_acc, part, counter, i_mn, i_s, SPLIT, M * N, o_y, mask, PARTIAL)
    if last:
        if HAS_BIAS:
            b_acc += tl.load(bias + o_n, mask=m_n, other=0.0).to(tl.float32)[None, :]
        tl.store(y + o_y, to_state_dtype(b_acc, y.dtype.element_ty), mask=mask)


@triton.jit
def int4_dequant_kernel(qw, sc, w, N, K, KH, G, GS: tl.constexpr, UP: tl.constexpr, PTX: tl.constexpr,
                        PACKED: tl.constexpr, BN: tl.constexpr, BH: tl.constexpr):
    """w [N, K] in w's dtype = int4(qw) * sc[n, k // GS], the product in fp32 and rounded once to
    nearest even (to_state_dtype rounds bf16 on the bits, so the interpreter rounds as the GPU does).
    PACKED (16-bit w, K even): byte h's two values are one 32-bit word of w (low nibble in the low
    half), stored as such: no interleave of the two halves in registers."""
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    o_n = i_n * BN + tl.arange(0, BN)
    o_h = i_h * BH + tl.arange(0, BH)
    m = (o_n < N)[:, None] & (o_h < KH)[None, :]
    b_q = tl.load(qw + o_n.to(tl.int64)[:, None] * KH + o_h[None, :], mask=m, other=0)
    b_lo, b_hi = int4_nibbles(b_q, w.dtype.element_ty, UP, PTX)
    b_lo, b_hi = b_lo.to(tl.float32), b_hi.to(tl.float32)
    if PACKED:
        # k = 2 h and 2 h + 1 lie in one group (GS is even)
        b_s = tl.load(sc + o_n.to(tl.int64)[:, None] * G + (2 * o_h[None, :]) // GS, mask=m, other=0.0).to(tl.float32)
        lo = to_state_dtype(b_lo * b_s, w.dtype.element_ty).to(tl.uint16, bitcast=True).to(tl.uint32)
        hi = to_state_dtype(b_hi * b_s, w.dtype.element_ty).to(tl.uint16, bitcast=True).to(tl.uint32)
        w32 = w.to(tl.pointer_type(tl.uint32))  # w's rows: KH 32-bit words each (K = 2 KH)
        tl.store(w32 + o_n.to(tl.int64)[:, None] * KH + o_h[None, :], lo | (hi << 16), mask=m)
    else:
        o_k = tl.interleave(2 * o_h, 2 * o_h + 1)
        b_v = tl.interleave(b_lo, b_hi)  # [BN, 2 BH], column k = 2 h + (0 low, 1 high)
        m_k = (o_n < N)[:, None] & (o_k < K)[None, :]
        b_s = tl.load(sc + o_n.to(tl.int64)[:, None] * G + o_k[None, :] // GS, mask=m_k, other=0.0).to(tl.float32)
        tl.store(w + o_n.to(tl.int64)[:, None] * K + o_k[None, :], to_state_dtype(b_v * b_s, w.dtype.element_ty),
                 mask=m_k)


# int4_dequant's tile: BN rows x BH bytes (2 BH values) a program, and whether 16-bit outputs are stored
# as packed 32-bit pairs (benchmarks/quant_linear_bench.py --sweep-skinny times alternatives; H100,
# Triton 3.6, unpacked: 8 x 256 took 80 us for 2048 -> 12288, 16 x 64 215 us; the unpacked form's
# interleave goes through 4 KB of shared memory, the packed one's through none: sm_90 compile report)
DEQUANT = dict(BN=8, BH=256, warps=4, packed=True)


def int4_dequant(qweight: torch.Tensor, scales: torch.Tensor, K: int, group_size: int, dtype: torch.dtype):
    """W [N, K] in dtype from qweight [N, ceil(K/2)] uint8 and scales [N, ceil(K/group_size)] (contiguous)."""
    N, KH = qweight.shape
    w = common.empty(N, K, dtype=dtype, device=qweight.device)
    BN, BH = DEQUANT["BN"], DEQUANT["BH"]
    packed = dtype != torch.float32 and K % 2 == 0 and group_size % 2 == 0 and DEQUANT["packed"]
    if N and K:
        int4_dequant_kernel[(cdiv(N, BN), cdiv(KH, BH))](qweight, scales, w, N, K, KH, scales.shape[1],
                                                        GS=group_size, UP=UPCAST,
                                                        PTX=triton_utils.NIBBLE_PTX, PACKED=packed, BN=BN, BH=BH,
                                                        num_warps=DEQUANT["warps"])
    return w


@triton.jit
def scale_columns_kernel(x, s, y, M, K, stride_x, BM: tl.constexpr, BK: tl.constexpr):
    """y[m, k] = x[m, k] * s[k], the product in fp32 rounded once to y's dtype (torch's x * s)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    ok = (rows < M)[:, None] & (cols < K)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    b_x = tl.load(x + r64 * stride_x + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    b_s = tl.load(s + cols, mask=cols < K, other=0.0).to(tl.float32)
    tl.store(y + r64 * K + cols[None, :], (b_x * b_s[None, :]).to(y.dtype.element_ty), mask=ok)


def scale_columns(x2: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """AWQ's pre-scale at prefill: x2 [M, K] (unit stride along K) times scale [K] (x2's dtype,
    contiguous), rounded to x2's dtype as torch's x2 * scale; [M, K] contiguous. One vectorised pass
    for torch's broadcast multiply, which took 39 us a call on an H100 at the 1.66B Qwen3.5 shapes
    (M = 4096, 96 calls per prefill: 3.8 ms of 36.7)."""
    M, K = x2.shape
    y = common.empty(M, K, dtype=x2.dtype, device=x2.device)
    if M and K:
        BK = min(1024, next_pow2(K))
        BM = max(1, min(4096 // BK, next_pow2(M)))
        scale_columns_kernel[(cdiv(M, BM), cdiv(K, BK))](x2, scale, y, M, K, x2.stride(0), BM=BM, BK=BK,
                                                         num_warps=4)
    return y


def tile_k(group_size: int, cap: int = 128) -> int | None:
    """The K tile: the largest power of two <= cap dividing group_size, at least 32 (a 16-wide dot
    needs BK / 2 >= 16 bytes... and K >= 16 for tl.dot); None where group_size admits none."""
    bk = cap
    while bk >= 32:
        if group_size % bk == 0:
            return bk
        bk //= 2
    return None


def int4_gemm(x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias=None, group_size: int = 128):
    """y [M, N] = x2 [M, K] @ W^T + bias, W from qweight [N, ceil(K/2)] uint8 and scales
    [N, ceil(K/group_size)] (contract of int4_linear); x2 fp32 / fp16 / bf16 with unit column stride,
    qweight and scales contiguous, group_size a multiple of 32. y in x2's dtype."""
    M, K = x2.shape
    N, KH = qweight.shape
    G = scales.shape[1]
    BK = tile_k(group_size)
    if BK is None:
        raise ValueError(f"int4 gemm: group_size {group_size} is not a multiple of 32")
    y = common.empty(M, N, dtype=x2.dtype, device=x2.device)
    if M == 0:
        return y
    if M > SKINNY_M:
        BK = tile_k(group_size, cap=64)  # 128-wide int4 tiles spill registers in the prefill tiles
    k_tiles = cdiv(K, BK)
    if M <= SKINNY_M:
        BM, BN = skinny_block_m(M), common.SKINNY["BN"]
        tiles = cdiv(M, BM) * cdiv(N, BN)
        split = split_k(tiles, k_tiles, device_sms(x2))
        per = cdiv(k_tiles, split)
        split = cdiv(k_tiles, per)
        warps, stages = common.SKINNY["warps"], common.SKINNY["stages"]
    else:
        fp32 = x2.dtype == torch.float32
        BM, BN = (64, 64) if fp32 else (128, 128)
        tiles, split, per = cdiv(M, BM) * cdiv(N, BN), 1, k_tiles
        warps, stages = 8, (2 if fp32 else 3)
    part = common.empty(split, M, N, dtype=torch.float32, device=x2.device) if split > 1 else y
    int4_gemm_kernel[(tiles, split)](
        x2, qweight, scales, bias if bias is not None else scales, y, part,
        common.counters(x2.device, tiles) if split > 1 else scales, M, N, K, KH, G, x2.stride(0), split, per,
        GS=group_size, UP=UPCAST, PARTIAL=split > 1, HAS_BIAS=bias is not None, BM=BM, BN=BN, BK=BK, GROUP_M=8,
        num_warps=warps, num_stages=stages)
    return y
