"""Flash-attention prefill that derives the mask from positions: no [B, 1, S, L] mask tensor.

    q             [B, H, S, D]   fp16 / bf16, any strides   H = G * Hkv: head h reads kv head h // G
    key, value    [B, Hkv, L, D] q's dtype, any strides     the in-place cache after this call's write
    past_lengths  [B] int32 / int64                         query s of row b is at position past_b + s
    sinks, window ints: window 0 = no streaming (slot j holds position j); window W > 0 = the
                  streaming ring: `sinks` slots hold positions 0.., the W = L - sinks others a ring
    o             [B, H, S, D]   q's dtype, strides of torch.empty_like(q): softmax(scale q key^T,
                  masked) value, scores and softmax in fp32
    An FP8 cache (key / value float8_e4m3fn with k_scale / v_scale, gdn_export.ops.attention.kv_fp8):
    each tile is loaded as fp8 and multiplied by its scale in fp32, then rounded to q's dtype.

The mask is gdn_export.ops.attention.visibility's, computed per tile from integers:
    no streaming   query at position P reads slot j iff j <= P
    streaming      slot j holds A_j (sinks: j; ring: the latest position <= past_b + S - 1 that lands in
                   j); P reads j iff A_j was written, A_j <= P, and (A_j < sinks or A_j > P - W)
A query row that may read no slot gets zeros.

Without streaming a query block of rows [m0, m1) reads slots [0, past_b + m1); the tiles wholly at
or below past_b + m0 need no mask (every row reads them) and run an unmasked loop, the last few a
masked one. That is what makes a long prefill cheap: the chunk of S new tokens against a cache of
past_b written slots costs S x past_b scores without a byte of mask (the [B, 1, S, L] bool mask of
kernels.attention.triton.prefill is S x L bytes per layer call: 1 GiB at S 4096, L 262144, read once
per query head and built per call). With streaming every tile of the L slots is visited and masked.

Shapes alone decide the launch (graph-safe, no host synchronisation).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.attention.triton.decode import DTYPES, _sm80, check_kv_scales, dequantize_tiles, online_softmax_step
from kernels.attention.triton.prefill import MAX_D, _sm90
from kernels.triton_utils import cdiv, next_pow2, to_state_dtype

LOG2E = 1.4426950408889634


@triton.jit
def _tile(b_q, k_ptr, v_ptr, cols, stride_kl, stride_kd, stride_vl, stride_vd, d, load_ok, b_m,
          qk_scale, m_i, l_i, acc, k_scale, v_scale, MASKED: tl.constexpr, KV_FP8: tl.constexpr):
    """One BLOCK_N-slot tile of the online softmax (base 2, fp32 scores and sums, P rounded to V's
    dtype for P V). load_ok [BLOCK_N, BLOCK_D]: which K / V elements to load (others read as 0);
    b_m [BLOCK_M, BLOCK_N]: which scores count (MASKED only)."""
    b_k = tl.load(k_ptr + cols[:, None] * stride_kl + d[None, :] * stride_kd, mask=load_ok, other=0.0)
    b_v = tl.load(v_ptr + cols[:, None] * stride_vl + d[None, :] * stride_vd, mask=load_ok, other=0.0)
    if KV_FP8:
        b_k, b_v = dequantize_tiles(b_k, b_v, k_scale, v_scale, b_q.dtype)
    return online_softmax_step(b_q, b_k, b_v, b_m, qk_scale, m_i, l_i, acc, MASKED)


@triton.jit
def attn_prefill_positions_kernel(
    q, k, v, o, past,
    stride_qb, stride_qh, stride_qs, stride_qd,
    stride_kb, stride_kh, stride_kl, stride_kd,
    stride_vb, stride_vh, stride_vl, stride_vd,
    stride_ob, stride_oh, stride_os, stride_od,
    qk_scale, S, L, SINKS, WINDOW, k_scale, v_scale,
    G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STREAMING: tl.constexpr, KV_FP8: tl.constexpr,
):
    # heads fastest (a block's G heads read the same K / V tiles close in time: L2), the last query
    # blocks (the longest ranges) first, batch rows slowest (kernels.attention.triton.prefill)
    i_h, i_b = tl.program_id(0), tl.program_id(2)
    i_m = tl.num_programs(1) - 1 - tl.program_id(1)
    i_b64, i_h64 = i_b.to(tl.int64), i_h.to(tl.int64)
    m0 = i_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    row_ok = rows < S
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    p_b = tl.load(past + i_b).to(tl.int32)
    qpos = p_b + rows  # [BLOCK_M] absolute positions

    p_q = q + i_b64 * stride_qb + i_h64 * stride_qh + rows[:, None] * stride_qs + d[None, :] * stride_qd
    b_q = tl.load(p_q, mask=row_ok[:, None] & d_ok[None, :], other=0)
    k_ptr = k + i_b64 * stride_kb + (i_h64 // G) * stride_kh
    v_ptr = v + i_b64 * stride_vb + (i_h64 // G) * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if STREAMING:
        last = p_b + S - 1  # the call's last written position
        slot_last = tl.where(last < SINKS, last, SINKS + (last - SINKS) % WINDOW)
        for start in range(0, L, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            # A_j: sinks hold themselves; ring slot j the latest position <= last landing in j
            back = ((slot_last - cols) % WINDOW + WINDOW) % WINDOW
            sink = cols < SINKS
            stored = tl.where(sink, cols, last - back)
            written = (cols < L) & ((sink & (stored <= last)) | (~sink & (stored >= SINKS)))
            b_m = (written[None, :] & (stored[None, :] <= qpos[:, None])
                   & ((stored[None, :] < SINKS) | (stored[None, :] > qpos[:, None] - WINDOW)) & row_ok[:, None])
            read = tl.max(b_m.to(tl.int32), 0) > 0  # some row of the block reads the slot
            m_i, l_i, acc = _tile(b_q, k_ptr, v_ptr, cols, stride_kl, stride_kd, stride_vl, stride_vd, d,
                                  read[:, None] & d_ok[None, :], b_m, qk_scale, m_i, l_i, acc, k_scale, v_scale,
                                  True, KV_FP8)
    else:
        m1 = tl.minimum(m0 + BLOCK_M, S)
        hi = tl.minimum(p_b + m1, L)  # one past the last slot a row of the block reads
        # tiles every row reads: slots <= p_b + m0 (the block's first query position)
        full = tl.multiple_of(tl.minimum(p_b + m0 + 1, hi) // BLOCK_N * BLOCK_N, BLOCK_N)
        kv_ok = (tl.arange(0, BLOCK_N) >= 0)[:, None] & d_ok[None, :]
        for start in range(0, full, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            m_i, l_i, acc = _tile(b_q, k_ptr, v_ptr, cols, stride_kl, stride_kd, stride_vl, stride_vd, d,
                                  kv_ok, kv_ok, qk_scale, m_i, l_i, acc, k_scale, v_scale, False, KV_FP8)
        for start in range(full, hi, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_ok = cols < hi
            b_m = (cols[None, :] <= qpos[:, None]) & col_ok[None, :]
            m_i, l_i, acc = _tile(b_q, k_ptr, v_ptr, cols, stride_kl, stride_kd, stride_vl, stride_vd, d,
                                  col_ok[:, None] & d_ok[None, :], b_m, qk_scale, m_i, l_i, acc, k_scale, v_scale,
                                  True, KV_FP8)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a row that may read nothing: zeros
    p_o = o + i_b64 * stride_ob + i_h64 * stride_oh + rows[:, None] * stride_os + d[None, :] * stride_od
    tl.store(p_o, to_state_dtype(out, o.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


# (BLOCK_M, BLOCK_N, num_warps, num_stages) by padded head dim and whether wgmma (sm_90) runs it.
# sm_90, compiled by benchmarks/sm90_compile_check.py (Triton 3.6 / 3.5): D = 256 at 128 x 64, 8 warps
# (two warpgroups of 64 rows), 254 registers, no spill, 192 KiB shared; 64 x 64 at 4 warps spills
# (160 B of stack); 64 x 128 needs 288 KiB of shared memory (sm_90 has 227). D = 128 at 128 x 64, 8
# warps: 182 registers. benchmarks/long_context.py times the candidates on the GPU
# (docs/perf/long_context.md).
CONFIGS = {
    "d256-sm90": (128, 64, 8, 2), "d256": (64, 32, 8, 2),
    "d128-sm90": (64, 32, 4, 3), "d128": (64, 32, 4, 3),
    "d64": (64, 64, 4, 3),
}


def config(D: int, sm90: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) at head dim D (CONFIGS)."""
    block_d = max(16, next_pow2(D))
    if block_d > 128:
        return CONFIGS["d256-sm90" if sm90 else "d256"]
    if block_d > 64:
        return CONFIGS["d128-sm90" if sm90 else "d128"]
    return CONFIGS["d64"]


def supports(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_lengths: torch.Tensor) -> bool:
    """Whether `attention_prefill_positions` takes these: q [B, H, S, D] and key / value [B, Hkv, L,
    D] in q's 16-bit dtype (or a float8_e4m3fn cache) with H a multiple of Hkv, D <= 256, past_lengths [B] integer on q's device
    (sm_80 or newer), offsets inside one (batch, head) slice within int32."""
    if q.dim() != 4 or key.dim() != 4 or value.shape != key.shape or past_lengths.shape != q.shape[:1]:
        return False
    B, H, S, D = q.shape
    Bk, Hkv, L, Dk = key.shape
    if Bk != B or Dk != D or Hkv == 0 or H % Hkv or not 1 <= D <= MAX_D or B * H * S * L == 0:
        return False
    if q.dtype not in DTYPES or key.dtype not in (q.dtype, torch.float8_e4m3fn) or value.dtype != key.dtype:
        return False
    if past_lengths.dtype not in (torch.int32, torch.int64) or past_lengths.device != q.device:
        return False
    span = max(max((x.shape[2] - 1) * x.stride(2) + (x.shape[3] - 1) * x.stride(3) for x in (q, key, value)),
               H * S * D)
    return span < 2**31 and _sm80(q.device)


def attention_prefill_positions(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                past_lengths: torch.Tensor, scale: float, sinks: int = 0, window: int = 0,
                                block: tuple[int, int] | None = None, k_scale: float | None = None,
                                v_scale: float | None = None) -> torch.Tensor:
    """Causal (or streaming) GQA attention of S new tokens per row against the in-place cache.

    Args:
        q [B, H, S, D], key / value [B, Hkv, L, D] in one 16-bit dtype (`supports`), the cache
            already holding this call's tokens; past_lengths [B] int (positions of query 0).
        scale: multiplies q key^T before the softmax.
        sinks, window: the streaming layout (window = L - sinks ring slots), or window 0 (slot j =
            position j).
        block: (BLOCK_M, BLOCK_N) instead of `config`'s (tests, tuning); powers of two >= 16.
        k_scale, v_scale: the scales of a float8_e4m3fn key / value cache (both, and only then).
    Returns:
        o [B, H, S, D] in q's dtype with torch.empty_like(q)'s strides; zeros on rows reading nothing.
    """
    if not supports(q, key, value, past_lengths):
        raise ValueError(f"attention_prefill_positions: unsupported q {tuple(q.shape)} {q.dtype}, key "
                         f"{tuple(key.shape)} {key.dtype}, value {tuple(value.shape)} {value.dtype}, "
                         f"past_lengths {tuple(past_lengths.shape)} {past_lengths.dtype} (16-bit q / key / "
                         f"value or a float8_e4m3fn cache, H a multiple of Hkv, D <= {MAX_D}, past_lengths [B] "
                         f"integer)")
    kv_fp8 = check_kv_scales("attention_prefill_positions", key, k_scale, v_scale)
    B, H, S, D = q.shape
    Hkv, L = key.shape[1], key.shape[2]
    if window and not (0 <= sinks < L and window == L - sinks):
        raise ValueError(f"attention_prefill_positions: a streaming cache of {L} slots has window = L - "
                         f"sinks, got sinks {sinks}, window {window}")
    block_m, block_n, num_warps, stages = config(D, _sm90(q.device))
    if block is not None:
        block_m, block_n = block
    o = torch.empty_like(q)
    attn_prefill_positions_kernel[(H, cdiv(S, block_m), B)](
        q, key, value, o, past_lengths, *q.stride(), *key.stride(), *value.stride(), *o.stride(),
        float(scale) * LOG2E, S, L, int(sinks), max(int(window), 1), float(k_scale or 1.0), float(v_scale or 1.0),
        G=H // Hkv, D=D, BLOCK_D=max(16, next_pow2(D)), BLOCK_M=block_m, BLOCK_N=block_n,
        STREAMING=bool(window), KV_FP8=kv_fp8, num_warps=num_warps, num_stages=stages)
    return o
