"""Split-KV ("flash-decoding") masked GQA attention for a few query rows per key/value head.

    q      [B, H, S, D]     fp16 / bf16, any strides     H = G * Hkv: head h reads kv head h // G
    key    [B, Hkv, L, D]   q's dtype, any strides       L = cache slots
    value  [B, Hkv, L, D]   q's dtype, any strides
    mask   [B, 1, S, L]     bool, True where query s may read slot l (broadcastable: size-1 dims
                            are read with stride 0, never copied)
    o      [B, H, S, D]     q's dtype: softmax(scale q key^T, masked) value, softmax in fp32
    An FP8 cache (key / value float8_e4m3fn with k_scale / v_scale, gdn_export.ops.attention.kv_fp8):
    each tile is loaded as fp8 and multiplied by its scale in fp32, then rounded to q's dtype.

At decode (S = 1) PyTorch's memory-efficient SDPA parallelises over B * Hkv * query blocks only:
B * Hkv thread blocks (2 for one sequence of the 1.66B model) stream the whole cache. Here the
G * S query rows of one kv head form a single tile (padded to >= 16 rows for tl.dot), and the
cache axis is split among n_splits programs per (batch, kv head):

    attn_decode_split_kernel    grid (B * Hkv, n_splits): each program walks its slice of L in
                                BLOCK_N slots (K, V in their storage dtype into tl.dot, fp32
                                accumulation, online softmax in fp32, base 2) and writes its
                                normalised fp32 partial output and log2-sum-exp to a workspace
    attn_decode_combine_kernel  grid (B * H * S, D / BLOCK_D): weighs the splits by
                                exp2(lse_i - max lse) and writes o in q's dtype

K and V rows are loaded only for slots that some row of the tile may read (a predicated load moves
no bytes): a short context in a long static cache reads only its visible slots, and whatever an
unwritten slot holds (NaN included) never reaches the output. A query row that may read no slot
gets zeros (as the op's CPU path, SDPA with a bool mask, gives).

Shapes alone decide the launch (split count, block sizes): no host synchronisation, so it runs
inside CUDA graphs and behind a custom op under torch.compile.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.triton_utils import cdiv, next_pow2, to_state_dtype
# 16-bit operands straight to the tensor cores; widened under the CPU interpreter (bf16 dot bug there)
from kernels.triton_utils import dot

DTYPES = (torch.float16, torch.bfloat16)
from kernels.attention.limits import MAX_ROWS, MAX_TILE, MIN_ROWS, max_rows  # noqa: E402,F401
MIN_KEYS = 64  # slots per split: at 64 the fp32 partials (M x D x 4 B) are M / 64 of its K + V bytes
WAVES = 4  # aim for this many programs per SM (latency hiding comes from many loads in flight)
DEFAULT_SMS = 132  # H200; the SM count where there is no CUDA device (Triton's interpreter)
LOG2E = 1.4426950408889634


@triton.jit
def online_softmax_step(b_q, b_k, b_v, b_m, qk_scale, m_i, l_i, acc, MASKED: tl.constexpr = True):
    """One K / V tile of a flash-attention row block (shared with attention_prefill and the
    positional prefill): scores q k^T * qk_scale (base 2), masked by b_m (MASKED; otherwise every row
    reads every slot of the tile and b_m is not read), folded into the running max m_i, sum l_i and
    fp32 accumulator acc; P is rounded to V's dtype for P V. Returns (m_i, l_i, acc)."""
    b_s = dot(b_q, tl.trans(b_k), False) * qk_scale
    if MASKED:
        b_s = tl.where(b_m, b_s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(b_s, 1))
    if MASKED:
        # rows with nothing readable yet keep m = -inf; subtracting 0 instead keeps exp2 at 0, not NaN
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_safe = m_new  # finite after a tile every row reads in full
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(b_s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + dot(p.to(b_v.dtype), b_v, False)
    return m_new, l_i, acc


@triton.jit
def dequantize_tiles(b_k, b_v, k_scale, v_scale, dtype: tl.constexpr):
    """FP8 K / V tiles times their scales in fp32, rounded to nearest even to dtype (q's) for the
    tensor cores: the values kv_dequantize gives (also under the interpreter, to_state_dtype)."""
    return to_state_dtype(b_k.to(tl.float32) * k_scale, dtype), to_state_dtype(b_v.to(tl.float32) * v_scale, dtype)


@triton.jit
def attn_decode_split_kernel(
    q, k, v, mask, part_o, part_lse,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_kl, stride_kd,
    stride_vb, stride_vh, stride_vl, stride_vd,
    stride_mb, stride_ms, stride_ml,
    qk_scale, L, keys_per_split, n_splits, k_scale, v_scale,
    HKV: tl.constexpr, G: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KV_FP8: tl.constexpr,
):
    i_bh, i_split = tl.program_id(0), tl.program_id(1)
    i_b, i_hkv = i_bh // HKV, i_bh % HKV
    M: tl.constexpr = G * S
    rows = tl.arange(0, BLOCK_M)  # row r = g * S + s: query head i_hkv * G + g, position s
    row_ok = rows < M
    g, s = rows // S, rows % S
    d = tl.arange(0, D)
    i_b64 = i_b.to(tl.int64)

    p_q = q + i_b64 * stride_qb + (i_hkv * G + g)[:, None].to(tl.int64) * stride_qh \
        + s[:, None] * stride_qs + d[None, :] * stride_qd
    b_q = tl.load(p_q, mask=row_ok[:, None], other=0)
    k_base = k + i_b64 * stride_kb + i_hkv.to(tl.int64) * stride_kh + d[None, :] * stride_kd
    v_base = v + i_b64 * stride_vb + i_hkv.to(tl.int64) * stride_vh + d[None, :] * stride_vd
    m_base = mask + i_b64 * stride_mb + s[:, None] * stride_ms

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the base-2 scores
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    lo = i_split * keys_per_split
    hi = tl.minimum(lo + keys_per_split, L)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        b_m = tl.load(m_base + cols[None, :].to(tl.int64) * stride_ml,
                      mask=row_ok[:, None] & (cols < hi)[None, :], other=0) != 0
        # slots no row may read are not loaded (zeros): no bytes moved, no garbage read
        read = (tl.max(b_m.to(tl.int32), 0) > 0)[:, None]
        b_k = tl.load(k_base + cols[:, None].to(tl.int64) * stride_kl, mask=read, other=0.0)
        b_v = tl.load(v_base + cols[:, None].to(tl.int64) * stride_vl, mask=read, other=0.0)
        if KV_FP8:
            b_k, b_v = dequantize_tiles(b_k, b_v, k_scale, v_scale, b_q.dtype)
        m_i, l_i, acc = online_softmax_step(b_q, b_k, b_v, b_m, qk_scale, m_i, l_i, acc)

    seen = l_i > 0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    # workspace [B * Hkv, n_splits, M, D] and [B * Hkv, n_splits, M]
    w_row = (i_bh.to(tl.int64) * n_splits + i_split) * M + rows
    tl.store(part_o + w_row[:, None] * D + d[None, :], out, mask=row_ok[:, None])
    tl.store(part_lse + w_row, lse, mask=row_ok)


@triton.jit
def attn_decode_combine_kernel(
    part_o, part_lse, o,
    stride_ob, stride_oh, stride_os, stride_od,
    n_splits,
    HKV: tl.constexpr, G: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
    BLOCK_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr,
):
    i_row, i_d = tl.program_id(0), tl.program_id(1)  # i_row = (b * Hkv + hkv) * M + r
    M: tl.constexpr = G * S
    i_bh, r = i_row // M, i_row % M
    i_b, i_hkv = i_bh // HKV, i_bh % HKV
    g, s = r // S, r % S
    d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
    base = i_bh.to(tl.int64) * n_splits

    lse_max = tl.full([BLOCK_SPLITS], float("-inf"), tl.float32)
    for i0 in range(0, n_splits, BLOCK_SPLITS):
        sp = i0 + tl.arange(0, BLOCK_SPLITS)
        lse = tl.load(part_lse + (base + sp) * M + r, mask=sp < n_splits, other=float("-inf"))
        lse_max = tl.maximum(lse_max, lse)
    top = tl.max(lse_max, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # nothing readable in any split: all weights 0

    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    den = tl.zeros([BLOCK_SPLITS], dtype=tl.float32)
    for i0 in range(0, n_splits, BLOCK_SPLITS):
        sp = i0 + tl.arange(0, BLOCK_SPLITS)
        ok = sp < n_splits
        w = tl.exp2(tl.load(part_lse + (base + sp) * M + r, mask=ok, other=float("-inf")) - top)
        b_o = tl.load(part_o + ((base + sp) * M + r)[:, None] * D + d[None, :], mask=ok[:, None], other=0)
        acc += tl.sum(w[:, None] * b_o, 0)
        den += w
    total = tl.sum(den, 0)
    out = acc / tl.where(total > 0, total, 1.0)  # a row that may read nothing: zeros
    p_o = o + i_b.to(tl.int64) * stride_ob + (i_hkv * G + g).to(tl.int64) * stride_oh + s * stride_os \
        + d * stride_od
    tl.store(p_o, to_state_dtype(out, o.dtype.element_ty))  # round to nearest even, also when interpreted


def check_kv_scales(who: str, key: torch.Tensor, k_scale, v_scale) -> bool:
    """True for an FP8 cache (float8_e4m3fn key / value, both scales given); ValueError when the
    scales and the cache dtype disagree."""
    fp8 = key.dtype == torch.float8_e4m3fn
    if fp8 != (k_scale is not None and v_scale is not None):
        raise ValueError(f"{who}: a {key.dtype} cache with k_scale {k_scale}, v_scale {v_scale} (float8_e4m3fn "
                         f"caches, and only they, take both scales)")
    return fp8


def inputs_fit(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> bool:
    """What both attention kernels (this one and attention_prefill) ask of their inputs: q [B, H, S,
    D] and key / value [B, Hkv, L, D] with H a multiple of Hkv, in one 16-bit dtype, a bool mask
    broadcastable to [B, 1, S, L] with one head; on a GPU, sm_80 or newer."""
    if q.dim() != 4 or key.dim() != 4 or value.shape != key.shape or mask.dim() != 4:
        return False
    B, H, S, D = q.shape
    Bk, Hkv, L, Dk = key.shape
    if Bk != B or Dk != D or Hkv == 0 or H % Hkv:
        return False
    kv_dtypes = (q.dtype, torch.float8_e4m3fn)  # float8: an FP8 cache, read with its scales
    if q.dtype not in DTYPES or key.dtype not in kv_dtypes or value.dtype != key.dtype or mask.dtype != torch.bool:
        return False
    try:
        torch.broadcast_shapes(mask.shape, (B, 1, S, L))
    except RuntimeError:
        return False
    return mask.shape[1] == 1 and _sm80(q.device)


def supports(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether `attention_decode` takes these shapes and dtypes (`inputs_fit`, and few query rows
    per kv head: G * S <= max_rows(D), D a power of two in 16..256)."""
    if not inputs_fit(q, key, value, mask):
        return False
    B, H, S, D = q.shape
    Hkv, L = key.shape[1], key.shape[2]
    return B * S * L != 0 and 16 <= D <= 256 and not D & (D - 1) and (H // Hkv) * S <= max_rows(D)


@functools.cache
def _sm80(device: torch.device) -> bool:
    # 16-bit tensor cores and the 99 KB of shared memory both kernels' configs plan for (CPU: the
    # interpreter)
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 0)


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def split_count(B: int, Hkv: int, L: int, block_n: int, sms: int = DEFAULT_SMS) -> tuple[int, int]:
    """(n_splits, keys_per_split) for a cache of L slots: enough programs for WAVES per SM, but at
    least MIN_KEYS slots each; a split is a whole number of BLOCK_N blocks, none of them empty."""
    n = max(1, min(cdiv(WAVES * sms, B * Hkv), cdiv(L, MIN_KEYS)))
    return _even_splits(L, n, block_n)


def _even_splits(L: int, n: int, block_n: int) -> tuple[int, int]:
    keys = cdiv(cdiv(L, n), block_n) * block_n
    return cdiv(L, keys), keys


def _config(D: int, block_m: int) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages). Shared memory holds num_stages - 1 K + V tile pairs (the
    loads in flight, BLOCK_N x D 16-bit values each) and the query tile. Compiled ahead of time
    with Triton 3.9 for sm_80 and sm_90 (ptxas, no spills): D = 256 with 16 rows takes 75,776 B
    (2 x (16 + 16) KiB of K, V + 8 KiB of q + 2 KiB), D = 128 with 16 rows 71-74 KB, and no shape
    `supports` admits more than 86 KB (the wider query tiles get 8 warps and 2 stages): inside the
    99 KB of sm_86 / sm_89 (sm_80: 163, sm_90: 227). Two tiles in flight per program matter where
    few programs share the GPU (batch 1)."""
    block_n = 32 if D > 128 else 64
    big = block_m * D > 16 * 256  # a wider fp32 accumulator than 16 x 256
    return block_n, 8 if big else 4, 2 if big else 3


def plan(q: torch.Tensor, key: torch.Tensor, n_splits: int | None = None, block_n: int | None = None):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages, n_splits, keys_per_split) of a launch: shapes (and
    the device's SM count) alone decide it."""
    B, H, S, D = q.shape
    Hkv, L = key.shape[1], key.shape[2]
    block_m = max(MIN_ROWS, next_pow2(H // Hkv * S))
    bn, num_warps, stages = _config(D, block_m)
    bn = block_n or bn
    if n_splits is None:
        n_splits, keys = split_count(B, Hkv, L, bn, _sm_count(q.device))
    else:
        n_splits, keys = _even_splits(L, n_splits, bn)
    return block_m, bn, num_warps, stages, n_splits, keys


def attention_decode(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                     scale: float, out: torch.Tensor | None = None, n_splits: int | None = None,
                     block_n: int | None = None, k_scale: float | None = None,
                     v_scale: float | None = None) -> torch.Tensor:
    """Masked GQA attention of a few query rows per kv head (module docstring for the shapes).

    Args:
        q [B, H, S, D], key / value [B, Hkv, L, D] in one 16-bit dtype, mask broadcastable to
            [B, 1, S, L] bool; G * S <= max_rows(D), D a power of two in 16..256 (`supports`).
        scale: multiplies q key^T before the softmax.
        out: optional [B, H, S, D] output in q's dtype (any strides), written whole.
        n_splits, block_n: override the split count and slots per block (tests, tuning).
        k_scale, v_scale: the scales of a float8_e4m3fn key / value cache (both, and only then).
    Returns:
        o [B, H, S, D] in q's dtype; zeros on query rows whose mask is all False.
    """
    if not supports(q, key, value, mask):
        raise ValueError(f"attention_decode: unsupported q {tuple(q.shape)} {q.dtype}, key "
                         f"{tuple(key.shape)} {key.dtype}, value {tuple(value.shape)} {value.dtype}, "
                         f"mask {tuple(mask.shape)} {mask.dtype} (16-bit q / key / value, bool mask, "
                         f"D a power of two in 16..256, G * S <= {max_rows(q.shape[-1])})")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device):
        raise ValueError(f"attention_decode: out must be {tuple(q.shape)} {q.dtype} on {q.device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    kv_fp8 = check_kv_scales("attention_decode", key, k_scale, v_scale)
    B, H, S, D = q.shape
    Hkv, L = key.shape[1], key.shape[2]
    G = H // Hkv
    M = G * S
    block_m, bn, num_warps, stages, n_splits, keys = plan(q, key, n_splits, block_n)
    o = out if out is not None else torch.empty(B, H, S, D, dtype=q.dtype, device=q.device)
    m = mask.expand(B, 1, S, L).view(torch.uint8)  # a bool view: stride 0 on broadcast dims
    part_o = torch.empty(B * Hkv, n_splits, M, D, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(B * Hkv, n_splits, M, dtype=torch.float32, device=q.device)

    attn_decode_split_kernel[(B * Hkv, n_splits)](
        q, key, value, m, part_o, part_lse, *q.stride(), *key.stride(), *value.stride(),
        m.stride(0), m.stride(2), m.stride(3), float(scale) * LOG2E, L, keys, n_splits,
        float(k_scale or 1.0), float(v_scale or 1.0),
        HKV=Hkv, G=G, S=S, D=D, BLOCK_M=block_m, BLOCK_N=bn, KV_FP8=kv_fp8, num_warps=num_warps,
        num_stages=stages)
    block_d = min(D, 64)
    attn_decode_combine_kernel[(B * Hkv * M, D // block_d)](
        part_o, part_lse, o, *o.stride(), n_splits,
        HKV=Hkv, G=G, S=S, D=D, BLOCK_SPLITS=32, BLOCK_D=block_d, num_warps=2)
    return o

