"""Decode (skinny) GEMM of the three quantized-linear formats for M <= SKINNY_M rows: y^T = W x^T with
the weight as the tensor cores' wide operand (contract: gdn_export/ops/quant_linear/__init__.py).

A decode GEMM is a pass over its weight bytes; the rows of x are few. Each program owns BN weight
rows (output columns) and all M rows of x, so the weight tile [BN, BK] is the MMA's M side (64 or
128 rows: Hopper's warpgroup MMA) and x's rows its N side (BM = 16..64, padded with masked zero
rows): no tile of weight is wasted on padding, and the weight loads feed tl.dot, so Triton streams
them through shared memory `num_stages` tiles ahead (cp.async), which keeps enough bytes in flight
to approach the copy bandwidth. K is split over programs so that every program of the launch is
resident at once (the split factor is the number of column tiles that fit the GPU's multiprocessors
times the programs one of them holds, read off the compiled kernel's registers and shared memory):
a second, partial wave of programs would double a decode GEMM's time. The partials are summed in the
same launch by the last program of each column tile (common.finish_split).

    FP8_TENSOR  weight e4m3 [N, K], ws [N] fp32, static per-tensor s_in: x quantized in the tile,
                e4m3(clamp(x / s_in)); y = (x_q W^T) * s_in * ws (+ bias)
    FP8_BLOCK   weight e4m3 [N, K], ws [ceil(N/128), ceil(K/128)]: x quantized in the tile per token
                and group of 128 (BK = 128: one group a tile), each tile's product scaled by both
    INT4        weight uint8 [N, ceil(K/2)] (low nibble even k, two's complement), ws = scales
                [N, ceil(K/GS)] in x's dtype; nibbles to x's dtype (exact) by magic-number
                arithmetic in registers (triton_utils.int4_nibbles), the low ones dotted with x's even
                columns and the high ones with its odd columns (no interleave); optional AWQ
                pre_scale [K]: x * pre_scale rounded to x's dtype in the tile, as the module's
                separate multiply would (no pass over x)

Products: fp8 tiles either as fp8 x fp8 MMAs (DOT_FP8) or widened to bf16 (exact) for a bf16 MMA;
both accumulate in fp32 (the fp8 MMA with Hopper's reduced-precision accumulate inside one K tile).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.quant_linear.triton import common
from kernels.quant_linear.triton.common import (
    SOFT_FP8, UPCAST, clamped_quotient, device_sms, exact_dot, finish_split, group_scale, quantize_e4m3, to_e4m3)
from kernels import triton_utils
from kernels.triton_utils import cdiv, int4_nibbles, next_pow2, pdl_enter, pdl_launch, prefetch_l2, to_state_dtype

FP8_TENSOR, FP8_BLOCK, INT4 = 0, 1, 2
# Rows of x this kernel takes (gpu.py routes M <= MAX_M here).
MAX_M = 64
# Launch parameters per format: BN weight rows a program, BK of K a tile, warps, pipeline stages,
# at most per_sm programs a multiprocessor (None: as many as its registers and shared memory hold),
# fp8 x fp8 MMAs (fp8 formats), min_tiles (optional, default 1): K tiles a program streams at least
# (a cap on the split), nibbles (INT4, optional, default triton_utils.NIBBLE_PTX): the nibble
# conversion's form, one_row (fp8 formats, optional, default off; on for FP8 per-channel): M = 1
# quantizes x's row alone (the kernel's ONE_ROW: 110 instead of 245 instructions a K tile in FP8's
# sm_90 code); benchmarks/quant_linear_bench.py --sweep-skinny times alternatives. The sweep's choice on the H100
# (Triton 3.6, 2026-12-07, the 1.66B's fused GDN projection and MLP down projection at M = 1 and
# 32): min_tiles 8, 4 stages and one_row for FP8 per-channel (mlp_down at M = 1: 10.1 us, 10.8
# without one_row, 12.2 with min_tiles 1), min_tiles 4 for the block and INT4 formats, INT4's
# nibbles on 2 bytes an instance (mlp_down at M = 1: 9.75 against 10.32 us).
CFG = {
    FP8_TENSOR: dict(BN=64, BK=128, warps=4, stages=4, per_sm=None, dot_fp8=True, min_tiles=8, one_row=True),
    FP8_BLOCK: dict(BN=64, BK=128, warps=4, stages=3, per_sm=None, dot_fp8=True, min_tiles=4),
    INT4: dict(BN=64, BK=128, warps=4, stages=3, per_sm=None, dot_fp8=False, min_tiles=4, nibbles=2),
}
# (compiled-kernel key) -> programs one multiprocessor holds at once
_RESIDENT: dict = {}


@triton.jit
def skinny_kernel(x, w, ws, s_in, pre, bias, y, part, counter, M, N, K, KH, G, stride_xm, SPLIT, TILES_PER_SPLIT,
                  FMT: tl.constexpr, GS: tl.constexpr, SOFT: tl.constexpr, UP: tl.constexpr,
                  DOT_FP8: tl.constexpr, PTX: tl.constexpr, HAS_PRE: tl.constexpr, PARTIAL: tl.constexpr,
                  HAS_BIAS: tl.constexpr, EVEN: tl.constexpr, ONE_ROW: tl.constexpr,
                  BN: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, USE_PDL: tl.constexpr):
    """Program (column tile i_n, K split i_s): acc [BN, BM] = W[tile rows, K range] x[:, K range]^T.
    EVEN: BN divides N and BK divides K, so the weight tiles need no bounds masks. ONE_ROW (the fp8
    formats at M = 1): x's row is quantized as a [BK] vector and placed as row 0 of the MMA's
    [BM, BK] operand, not all BM rows of it (the other BM - 1 are zero padding). With PDL the
    program's weight bytes are prefetched into L2 while the kernel before it runs."""
    i_n, i_s = tl.program_id(0), tl.program_id(1)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < N
    o_n64 = o_n.to(tl.int64)
    r_n = tl.arange(0, BN)
    o_m = tl.arange(0, BM)
    m_m = o_m < M
    xdt = x.dtype.element_ty
    if FMT == 2:
        p_w = w + (i_n * BN).to(tl.int64) * KH
    else:
        p_w = w + (i_n * BN).to(tl.int64) * K
    t0 = i_s * TILES_PER_SPLIT
    t1 = tl.minimum(t0 + TILES_PER_SPLIT, tl.cdiv(K, BK))
    if USE_PDL:
        # the weight is no activation: its lines [t0, t1) of each row go to L2 before the wait
        row_bytes = KH if FMT == 2 else K
        tile_bytes = BK // 2 if FMT == 2 else BK
        p_row = p_w + tl.where(m_n, r_n, 0).to(tl.int64) * row_bytes
        for off in range(t0 * tile_bytes, t1 * tile_bytes, 128):
            prefetch_l2(p_row + tl.minimum(off, row_bytes - 1))
    pdl_enter(USE_PDL)
    if FMT == 0:
        s = tl.load(s_in)
        r = tl.math.div_rn(1.0, s)
    b_acc = tl.zeros([BN, BM], dtype=tl.float32)
    # the weight scales, AWQ's pre_scale and ONE_ROW's [BK] slice of x are loaded one K tile ahead
    # (the pipeliner streams only tl.dot's operands; a load in the loop body waited its full latency
    # every tile)
    b_sn = _tile_scales(ws, o_n, m_n, t0, G, FMT, GS, BK)
    b_pn = _tile_vector(pre, t0, K, HAS_PRE, BK)
    b_xn = _tile_vector(x, t0, K, ONE_ROW, BK)
    for t in range(t0, t1):
        o_k = t * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_s, b_p, b_x1 = b_sn, b_pn, b_xn
        t_n = tl.minimum(t + 1, t1 - 1)
        b_sn = _tile_scales(ws, o_n, m_n, t_n, G, FMT, GS, BK)
        b_pn = _tile_vector(pre, t_n, K, HAS_PRE, BK)
        b_xn = _tile_vector(x, t_n, K, ONE_ROW, BK)
        if not ONE_ROW:
            b_x = tl.load(x + o_m[:, None] * stride_xm + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0.0)
        if FMT == 2:
            # byte h of a weight row holds k = 2 h (low nibble) and 2 h + 1 (high): the low nibbles
            # meet x's even columns and the high ones its odd columns, two dots of BK / 2
            o_h = t * (BK // 2) + tl.arange(0, BK // 2)
            if EVEN:
                b_q = tl.load(p_w + r_n[:, None] * KH + o_h[None, :])
            else:
                b_q = tl.load(p_w + r_n[:, None] * KH + o_h[None, :], mask=m_n[:, None] & (o_h < KH)[None, :],
                              other=0)
            b_lo, b_hi = int4_nibbles(b_q, tl.float32 if UP else xdt, UP, PTX)
            if HAS_PRE:
                b_x = to_state_dtype(b_x.to(tl.float32) * b_p[None, :], xdt)
            if UP:
                b_x = b_x.to(tl.float32)
            b_xe, b_xo = tl.split(tl.reshape(b_x, [BM, BK // 2, 2]))  # [BM, BK / 2]: x's even, odd columns
            b_d = exact_dot(b_lo, tl.trans(b_xe), UP) + exact_dot(b_hi, tl.trans(b_xo), UP)
            b_acc += b_d * b_s[:, None]
        else:
            if EVEN:
                b_w = tl.load(p_w + r_n[:, None] * K + o_k[None, :])
            else:
                b_w = tl.load(p_w + r_n[:, None] * K + o_k[None, :], mask=m_n[:, None] & m_k[None, :], other=0.0)
            if ONE_ROW:
                if FMT == 1:
                    # the row's group scale, held in every entry of a [BM] vector (the rows past M meet
                    # zero rows of x in the MMA)
                    b_g = tl.zeros([BM], dtype=tl.float32) + tl.maximum(tl.max(tl.abs(b_x1), axis=0), 1e-10)
                    b_g = tl.math.div_rn(b_g, tl.full(b_g.shape, 448.0, tl.float32))
                    b_r = tl.math.div_rn(tl.full(b_g.shape, 1.0, tl.float32), b_g)
                    b_q1 = clamped_quotient(b_x1, tl.max(b_g, axis=0), tl.max(b_r, axis=0))
                else:
                    b_q1 = clamped_quotient(b_x1, s, r)
                b_a = to_e4m3(tl.where(o_m[:, None] == 0, b_q1[None, :], 0.0), SOFT)
            else:
                b_xf = b_x.to(tl.float32)
                if FMT == 1:
                    b_g = group_scale(b_xf)  # [BM] group scales
                    b_r = tl.math.div_rn(tl.full(b_g.shape, 1.0, tl.float32), b_g)
                    b_a = quantize_e4m3(b_xf, b_g[:, None], b_r[:, None], SOFT)
                else:
                    b_a = quantize_e4m3(b_xf, s, r, SOFT)
            if DOT_FP8 and not UP:
                b_d = tl.dot(b_w, tl.trans(b_a))
            else:
                b_d = exact_dot(b_w.to(tl.bfloat16), tl.trans(b_a.to(tl.bfloat16)), UP)
            if FMT == 1:
                b_acc += b_d * b_s[:, None] * b_g[None, :]
            else:
                b_acc += b_d
    mask = m_n[:, None] & m_m[None, :]
    o_y = o_m.to(tl.int64)[None, :] * N + o_n64[:, None]
    b_acc, last = finish_split(b_acc, part, counter, i_n, i_s, SPLIT, M * N, o_y, mask, PARTIAL)
    if last:
        if FMT == 0:
            b_acc = b_acc * (s * tl.load(ws + o_n, mask=m_n, other=0.0))[:, None]
        if HAS_BIAS:
            b_acc += tl.load(bias + o_n, mask=m_n, other=0.0).to(tl.float32)[:, None]
        tl.store(y + o_y, to_state_dtype(b_acc, y.dtype.element_ty), mask=mask)


@triton.jit
def _tile_scales(ws, o_n, m_n, t, G, FMT: tl.constexpr, GS: tl.constexpr, BK: tl.constexpr):
    """[BN] fp32 weight scales of K tile t: FP8_BLOCK the 128-row block's for group t, INT4 each row's
    for group t * BK // GS; FP8_TENSOR none (its per-channel scales apply after the sum)."""
    if FMT == 1:
        return tl.load(ws + (o_n // 128) * G + t, mask=m_n, other=0.0)
    elif FMT == 2:
        return tl.load(ws + o_n.to(tl.int64) * G + (t * BK) // GS, mask=m_n, other=0.0).to(tl.float32)
    else:
        return tl.zeros(o_n.shape, dtype=tl.float32)


@triton.jit
def _tile_vector(v, t, K, LOAD: tl.constexpr, BK: tl.constexpr):
    """[BK] fp32 K tile t of a [K] vector (x's one row, AWQ's pre_scale); zeros unless LOAD."""
    o_k = t * BK + tl.arange(0, BK)
    if LOAD:
        return tl.load(v + o_k, mask=o_k < K, other=0.0).to(tl.float32)
    else:
        return tl.zeros([BK], dtype=tl.float32)


def block_k(fmt: int, K: int, group_size: int, cfg: dict) -> int:
    """The K tile: cfg's BK, except 128 for FP8_BLOCK (one activation group a tile) and, for INT4, at
    most the group size (a tile lies in one group; group_size a multiple of 32); never far past K."""
    bk = cfg["BK"]
    if fmt == FP8_BLOCK:
        return 128
    if fmt == INT4:
        bk = min(bk, group_size)
        while group_size % bk:
            bk //= 2
    return max(32, min(bk, next_pow2(K)))


def skinny(fmt: int, x2: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, s_in=None, bias=None, group_size: int = 128,
           pre_scale=None, cfg: dict | None = None) -> torch.Tensor:
    """y [M, N] in x2's dtype for x2 [M, K] (M <= MAX_M, unit column stride) and one of the formats of the
    module docstring: w [N, K] e4m3 or [N, ceil(K/2)] uint8 (contiguous), ws the format's scales (contiguous;
    INT4: x's dtype), s_in [] fp32 (FP8_TENSOR), bias [N] in x's dtype or None, pre_scale [K] (INT4) or None.
    cfg overrides CFG[fmt] (the benchmark's sweep)."""
    M, K = x2.shape
    if M > MAX_M:
        raise ValueError(f"skinny GEMM: x has {M} rows, more than {MAX_M}")
    if fmt == INT4 and group_size % 32:
        raise ValueError(f"skinny GEMM: int4 group_size {group_size} is not a multiple of 32")
    cfg = CFG[fmt] if cfg is None else {**CFG[fmt], **cfg}
    N = w.shape[0]
    y = common.empty(M, N, dtype=x2.dtype, device=x2.device)
    if M == 0 or N == 0:
        return y
    BN, BK = cfg["BN"], block_k(fmt, K, group_size, cfg)
    BM = max(16, next_pow2(M))
    tiles, k_tiles = cdiv(N, BN), cdiv(K, BK)
    G = ws.shape[1] if fmt != FP8_TENSOR else 1
    consts = dict(FMT=fmt, GS=group_size, SOFT=SOFT_FP8, UP=UPCAST,
                  DOT_FP8=bool(cfg["dot_fp8"]) and x2.dtype != torch.float32,
                  PTX=int(cfg.get("nibbles", triton_utils.NIBBLE_PTX)),
                  HAS_PRE=pre_scale is not None,
                  HAS_BIAS=bias is not None, EVEN=N % BN == 0 and K % BK == 0, ONE_ROW=M == 1 and fmt != INT4 and bool(cfg.get("one_row")),
                  BN=BN, BM=BM, BK=BK,
                  num_warps=cfg["warps"], num_stages=cfg["stages"])
    args = [x2, w, ws, s_in if s_in is not None else ws, pre_scale if pre_scale is not None else ws,
            bias if bias is not None else ws, y]

    def launch(split: int, grid_only: bool = False):
        per = cdiv(k_tiles, split)
        split = cdiv(k_tiles, per)
        part = common.empty(split, M, N, dtype=torch.float32, device=x2.device) if split > 1 else y
        counter = common.counters(x2.device, tiles) if split > 1 else ws
        full = (*args, part, counter, M, N, K, w.shape[1], G, x2.stride(0), split, per)
        if grid_only:  # compile only: the kernel's resources for the occupancy
            return skinny_kernel.warmup(*full, PARTIAL=True, grid=(tiles, split), **consts, **pdl_launch(x2))
        skinny_kernel[(tiles, split)](*full, PARTIAL=split > 1, **consts, **pdl_launch(x2))

    resident = _resident(x2, w, consts, lambda: launch(2, grid_only=True))
    if cfg.get("per_sm"):
        resident = min(resident, cfg["per_sm"])
    launch(max(1, min(k_tiles // cfg.get("min_tiles", 1), resident * device_sms(x2) // tiles)))
    return y


def _resident(x2: torch.Tensor, w: torch.Tensor, consts: dict, compile_partial) -> int:
    """Programs of this specialization one multiprocessor holds at once: its shared memory over the
    kernel's, its register file over the kernel's registers (allocated 256 a warp), its thread slots
    over the program's; read once per specialization from the compiled kernel (2 under the interpreter)."""
    key = (x2.dtype, w.dtype, x2.device, *sorted(consts.items()))
    got = _RESIDENT.get(key)
    if got is None:
        got = 2
        if x2.is_cuda and not common.INTERPRET:
            kernel = compile_partial()
            kernel._init_handles()
            props = torch.cuda.get_device_properties(x2.device)
            smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
            regs = getattr(props, "regs_per_multiprocessor", 65536)
            warps = consts["num_warps"]
            by_smem = smem // (kernel.metadata.shared + 1024)  # 1 KB a block is the system's
            by_regs = regs // (-(-kernel.n_regs * 32 // 256) * 256 * warps)
            got = max(1, min(by_smem, by_regs, 2048 // (32 * warps), 32))
        _RESIDENT[key] = got
    return got


__all__ = ["CFG", "FP8_BLOCK", "FP8_TENSOR", "INT4", "MAX_M", "block_k", "skinny"]
