"""Flash-attention prefill: masked GQA attention of many query rows against a static K/V cache.

    q      [B, H, S, D]     fp16 / bf16, any strides     H = G * Hkv: head h reads kv head h // G
    key    [B, Hkv, L, D]   q's dtype, any strides       L = cache slots (L >= S in the model)
    value  [B, Hkv, L, D]   q's dtype, any strides
    mask   [B, 1, S, L]     bool, True where query s may read slot l (broadcastable: size-1 dims
                            are read with stride 0, never copied)
    o      [B, H, S, D]     q's dtype, strides of torch.empty_like(q): softmax(scale q key^T,
                            masked) value, scores and softmax in fp32
    An FP8 cache (key / value float8_e4m3fn with k_scale / v_scale, gdn_export.ops.attention.kv_fp8):
    each tile is loaded as fp8 and multiplied by its scale in fp32, then rounded to q's dtype.

PyTorch's memory-efficient SDPA takes a dense mask as a bias and computes the whole S x L rectangle:
for a causal prefill half of it is masked, for a short context in a long cache most of it. Here

    kv_range_kernel     grid (B, n_m, L / BLOCK_L), one small launch (no host synchronisation):
                        per batch row and query block of BLOCK_M rows, whether any of its rows may
                        read each slot ([B, n_m, L] bytes) and, by atomic max, the range [lo, hi)
                        that holds those slots (empty if none)
    attn_prefill_kernel grid (H, n_m, B): each program takes BLOCK_M query rows of one head and
                        walks only [lo, hi) (lo rounded down to a tile) in BLOCK_N-slot tiles: fp32
                        scores, online softmax in fp32 (base 2), P rounded to q's dtype for P @ V
                        (as flash attention does), fp32 accumulator; the mask tile applies on every
                        tile

K and V rows are loaded only for slots some row of the block may read (a predicated load moves no
bytes and reads no garbage), so whatever an unwritten or evicted slot holds (NaN included) never
reaches the output. A query row that may read no slot gets zeros (as the decode kernel and the op's
CPU path give). D need not be a power of two: it is padded to BLOCK_D with masked loads.

Shapes alone decide the launch: it runs inside CUDA graphs and behind a custom op under
torch.compile. On the H200 (bf16, H 16, Hkv 2, D 256, L 4128, causal; CUDA graph, Triton 3.6):
0.48 ms at B 1, S 4096 (the SDPA route: 2.7 ms), 0.04 ms at S 512 (2.0 ms), 0.39 ms for 4 ragged
rows of S 1024 (2.7 ms); D 128 at S 4096: 0.25 ms (0.98 ms).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.triton_utils import cdiv, next_pow2, to_state_dtype
# the online-softmax update of one K / V tile, as the split-KV decode kernel does it
from kernels.attention.triton.decode import check_kv_scales, dequantize_tiles, inputs_fit, online_softmax_step

MAX_D = 256
LOG2E = 1.4426950408889634
# kv_range_kernel: mask bytes per program and warps. 21 us for a 4096 x 4128 mask on the H200 (CUDA
# graph, the zeroing included); 16 KiB or 8 warps took 23-34 us.
RANGE_TILE = 8192
RANGE_WARPS = 4


@triton.jit
def kv_range_kernel(mask, kv_range, kv_read, stride_mb, stride_ms, stride_ml, S, L,
                    BLOCK_M: tl.constexpr, BLOCK_L: tl.constexpr):
    # kv_read [Bm, n_m, L] uint8; kv_range [Bm, n_m, 2] int32, zeroed: (L - lo, hi) so that one
    # atomic max per program serves both ends, and a block that reads nothing keeps (L - L, 0)
    i_b, i_m, i_l = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_bm = i_b * tl.num_programs(1) + i_m
    rows = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = i_l * BLOCK_L + tl.arange(0, BLOCK_L)
    col_ok = cols < L
    p_m = mask + i_b.to(tl.int64) * stride_mb + rows[:, None].to(tl.int64) * stride_ms + cols[None, :] * stride_ml
    b_m = tl.load(p_m, mask=(rows < S)[:, None] & col_ok[None, :], other=0)
    read = tl.max(b_m.to(tl.int32), 0) > 0
    tl.store(kv_read + i_bm.to(tl.int64) * L + cols, read.to(tl.uint8), mask=col_ok)
    tl.atomic_max(kv_range + i_bm * 2, L - tl.min(tl.where(read, cols, L), 0))
    tl.atomic_max(kv_range + i_bm * 2 + 1, tl.max(tl.where(read, cols + 1, 0), 0))


@triton.jit
def attn_prefill_kernel(
    q, k, v, mask, o, kv_range, kv_read,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_kl, stride_kd,
    stride_vb, stride_vh, stride_vl, stride_vd,
    stride_ob, stride_oh, stride_os, stride_od,
    stride_mb, stride_ms, stride_ml,
    stride_rb, stride_rm, stride_ab, stride_am,
    qk_scale, S, L, k_scale, v_scale,
    G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KV_FP8: tl.constexpr,
):
    # heads vary fastest: a query block's G heads read the same K / V tiles close in time (L2); the
    # last query blocks (the longest ranges of a causal prefill) start first: fewer stragglers.
    # Batch rows slowest: on the H200, 8-15% faster than (B * H, n_m) for ragged batches
    i_h, i_b = tl.program_id(0), tl.program_id(2)
    i_m = tl.num_programs(1) - 1 - tl.program_id(1)
    i_b64, i_h64 = i_b.to(tl.int64), i_h.to(tl.int64)
    rows = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < S
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D

    p_q = q + i_b64 * stride_qb + i_h64 * stride_qh + rows[:, None] * stride_qs + d[None, :] * stride_qd
    b_q = tl.load(p_q, mask=row_ok[:, None] & d_ok[None, :], other=0)
    # 64-bit scalar bases, 32-bit offsets inside one (batch, head) slice (`supports` checks they
    # fit): a tile of 64-bit pointers held across the loop costs 2 registers per element (spills)
    k_ptr = k + i_b64 * stride_kb + (i_h64 // G) * stride_kh
    v_ptr = v + i_b64 * stride_vb + (i_h64 // G) * stride_vh
    m_ptr = mask + i_b64 * stride_mb
    p_read = kv_read + i_b64 * stride_ab + i_m * stride_am
    p_range = kv_range + i_b * stride_rb + i_m * stride_rm
    hi = tl.load(p_range + 1)
    lo = L - tl.load(p_range)  # stored as L - lo (kv_range_kernel)
    # from a whole tile (aligned, vectorised mask loads); a block that reads nothing: lo = hi = 0
    lo = tl.multiple_of(tl.minimum(lo // BLOCK_N * BLOCK_N, hi), BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the base-2 scores
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        # slots up to L, not hi (all False past hi anyway): with L % 16 == 0, Triton's divisibility
        # specialisation then lets the mask rows load 16 bytes at a time
        in_range = cols < L
        # slots no row of the block may read are not loaded (zeros): no bytes moved, no NaN read
        read = tl.load(p_read + cols, mask=in_range, other=0) != 0
        kv_ok = read[:, None] & d_ok[None, :]
        b_k = tl.load(k_ptr + cols[:, None] * stride_kl + d[None, :] * stride_kd, mask=kv_ok, other=0.0)
        b_v = tl.load(v_ptr + cols[:, None] * stride_vl + d[None, :] * stride_vd, mask=kv_ok, other=0.0)
        if KV_FP8:
            b_k, b_v = dequantize_tiles(b_k, b_v, k_scale, v_scale, b_q.dtype)
        b_m = tl.load(m_ptr + rows[:, None] * stride_ms + cols[None, :] * stride_ml, mask=row_ok[:, None] & in_range[None, :], other=0) != 0
        m_i, l_i, acc = online_softmax_step(b_q, b_k, b_v, b_m, qk_scale, m_i, l_i, acc)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a row that may read nothing: zeros
    p_o = o + i_b64 * stride_ob + i_h64 * stride_oh + rows[:, None] * stride_os + d[None, :] * stride_od
    # round to nearest even, also when interpreted
    tl.store(p_o, to_state_dtype(out, o.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def config(D: int, sm90: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) at head dim D (padded to a power of two).

    Shared memory holds the query tile (BLOCK_M x BLOCK_D 16-bit values), the K and V tiles in
    flight (2 x BLOCK_N x BLOCK_D per stage) and the mask tiles, plus layout-conversion scratch:
    at most 98 KiB on sm_90 and 70 KiB on sm_80 / sm_86 here (compiled with Triton 3.9), inside
    the 99 KB of sm_86 / sm_89 (sm_80: 163 KB, sm_90: 227 KB). One warpgroup on 64 query rows
    (wgmma's M) was the fastest of the configurations timed on the H200 (S = 4096, L = 4128,
    Triton 3.6), without spills:
        D = 256: 64 x 32, 2 stages; 8 warps took 2x, 128 x 64 at 8 warps 1.15x
        D = 128: 64 x 32, 3 stages; 128 x 64 at 8 warps 1.1x
        D <= 64: 64 x 64, 3 stages; 128 x 64 at 8 warps 1.03x at D = 64, 1.2x at D = 32
    Without wgmma (sm_80 / sm_86, mma.sync: operands and accumulator in registers) the 64 x 256
    accumulator and query tile spill at 4 warps and fit at 8 (not timed).
    """
    block_d = max(16, next_pow2(D))
    if block_d > 128:
        return 64, 32, 4 if sm90 else 8, 2
    return (64, 32, 4, 3) if block_d > 64 else (64, 64, 4, 3)


def supports(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether `attention_prefill` takes these shapes and dtypes (attention_decode.inputs_fit, D <=
    MAX_D, offsets inside one (batch, head) slice within int32)."""
    if not inputs_fit(q, key, value, mask):
        return False
    B, H, S, D = q.shape
    L = key.shape[2]
    return B * H * S * L != 0 and 1 <= D <= MAX_D and _offsets_fit(q, key, value, mask)


def _offsets_fit(q, key, value, mask) -> bool:
    # the kernel's offsets inside one (batch, head) slice are int32; o (empty_like(q)) spans H * S * D
    S, L = q.shape[2], key.shape[2]
    m = mask.expand(mask.shape[0], 1, S, L)
    span = max(max((x.shape[2] - 1) * x.stride(2) + (x.shape[3] - 1) * x.stride(3) for x in (q, key, value)),
               (S - 1) * m.stride(2) + (L - 1) * m.stride(3), q.shape[1] * S * q.shape[3])
    return span < 2**31


@functools.cache
def _sm90(device: torch.device) -> bool:
    # wgmma (Hopper): 4 warps hold the D = 256 tiles in `config`; sm_8x spill there (Blackwell: untried)
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


def kv_ranges(mask: torch.Tensor, L: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Of a mask [Bm, 1, Sm, L or 1] (Bm: 1 or B, Sm: 1 or S), per batch row and block i of block_m
    query rows (one block where Sm = 1: the same for all):
        ranges [Bm, n_m, 2] int32: (L - lo, hi), lo the first slot any row of the block may read,
            hi one past the last; (0, 0) where none
        read   [Bm, n_m, L] bool: whether any row of the block may read slot l
    One launch of kv_range_kernel, no host synchronisation."""
    Bm, Sm = mask.shape[0], mask.shape[2]
    n_m = cdiv(Sm, block_m)
    m = mask.expand(Bm, 1, Sm, L).view(torch.uint8)
    ranges = torch.zeros(Bm, n_m, 2, dtype=torch.int32, device=mask.device)
    read = torch.empty(Bm, n_m, L, dtype=torch.uint8, device=mask.device)
    block_l = max(16, RANGE_TILE // block_m)
    kv_range_kernel[(Bm, n_m, cdiv(L, block_l))](
        m, ranges, read, m.stride(0), m.stride(2), m.stride(3), Sm, L,
        BLOCK_M=block_m, BLOCK_L=block_l, num_warps=RANGE_WARPS)
    return ranges, read.view(torch.bool)


def attention_prefill(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                      scale: float, block: tuple[int, int] | None = None, k_scale: float | None = None,
                      v_scale: float | None = None) -> torch.Tensor:
    """Masked GQA attention of many query rows (module docstring for the shapes).

    Args:
        q [B, H, S, D], key / value [B, Hkv, L, D] in one 16-bit dtype, mask broadcastable to
            [B, 1, S, L] bool; D <= 256 (`supports`).
        scale: multiplies q key^T before the softmax.
        block: (BLOCK_M, BLOCK_N) instead of `config`'s (tests, tuning); powers of two >= 16.
        k_scale, v_scale: the scales of a float8_e4m3fn key / value cache (both, and only then).
    Returns:
        o [B, H, S, D] in q's dtype with the strides of torch.empty_like(q); zeros on query rows
        whose mask is all False.
    """
    if not supports(q, key, value, mask):
        raise ValueError(f"attention_prefill: unsupported q {tuple(q.shape)} {q.dtype}, key "
                         f"{tuple(key.shape)} {key.dtype}, value {tuple(value.shape)} {value.dtype}, "
                         f"mask {tuple(mask.shape)} {mask.dtype} (16-bit q / key / value, bool mask "
                         f"broadcastable to [B, 1, S, L], H a multiple of Hkv, D <= {MAX_D})")
    kv_fp8 = check_kv_scales("attention_prefill", key, k_scale, v_scale)
    B, H, S, D = q.shape
    Hkv, L = key.shape[1], key.shape[2]
    block_m, block_n, num_warps, stages = config(D, _sm90(q.device))
    if block is not None:
        block_m, block_n = block
    n_m = cdiv(S, block_m)
    o = torch.empty_like(q)
    m = mask.expand(B, 1, S, L).view(torch.uint8)  # a bool view: stride 0 on broadcast dims
    ranges, read = kv_ranges(mask, L, block_m)
    ranges, read = ranges.expand(B, n_m, 2), read.view(torch.uint8).expand(B, n_m, L)

    attn_prefill_kernel[(H, n_m, B)](
        q, key, value, m, o, ranges, read, *q.stride(), *key.stride(), *value.stride(), *o.stride(),
        m.stride(0), m.stride(2), m.stride(3), ranges.stride(0), ranges.stride(1), read.stride(0),
        read.stride(1), float(scale) * LOG2E, S, L, float(k_scale or 1.0), float(v_scale or 1.0),
        G=H // Hkv, D=D, BLOCK_D=max(16, next_pow2(D)), BLOCK_M=block_m, BLOCK_N=block_n, KV_FP8=kv_fp8,
        num_warps=num_warps, num_stages=stages)
    return o
