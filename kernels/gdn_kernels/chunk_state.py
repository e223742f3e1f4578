"""Split prefill (impl="split"), part 2 of 3: the sequential state walk, without the output.

After wy.py (w, u, gcum for all chunks), one program per (value block, sequence x value head)
walks the chunks of its sequence in order with the fp32 state block h [Dk, BV] in registers:

    h_c   = h                                        stored: the state entering chunk c
    v_new = u - w h                                  stored: this chunk's corrected values
    h     = exp(G_last) h + (k exp(G_last - G))^T v_new

chunk_output.py then computes o for all chunks in parallel from h_c and v_new. Compared with the
fused walk (chunk.py) the chain per chunk keeps two of its four products and loses the q and Aqk
loads and the o store, and with less in the loop the value axis can be split finer (more
programs in flight) at the price of writing h_c and v_new once and reading them back once.

Precision: as in the fused walk, w h reads the state rounded to the input dtype for 16-bit inputs
and the state update stays TF32 on fp32 operands; h_c is stored in the input dtype by default
(the fused walk's q h product reads exactly that rounding), fp32 for fp32 inputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn_kernels.utils import CHUNK, next_pow2, num_sms
from gdn_kernels.wy import _dot


# T and the chunk count are left unspecialised: one compiled kernel serves every length.
@triton.jit(do_not_specialize=["T", "NTT"])
def chunk_state_fwd_kernel(
    k, w, u, gcum, kscale, h0, h, v_new, ht,
    cu_seqlens, chunk_offsets,
    T, NTT,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    USE_INITIAL_STATE: tl.constexpr, IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr, NUM_STAGES: tl.constexpr, HALF_DOTS: tl.constexpr,
):
    BT: tl.constexpr = 64
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // HV, i_nh % HV
    i_hk = i_h // (HV // HK)
    if IS_VARLEN:
        i_b = 0
        bos, eos = tl.load(cu_seqlens + i_n), tl.load(cu_seqlens + i_n + 1)
        c0 = tl.load(chunk_offsets + i_n)
    else:
        i_b = i_n
        bos, eos = i_n * T, i_n * T + T
        c0 = 0
    Tn = eos - bos
    r0 = (i_b * HV + i_h) * T + bos - i_b * T   # first row of this sequence in the intermediates
    hc0 = (i_b * HV + i_h) * NTT + c0           # its first chunk in h [B, Hv, NTT, Dk, Dv]

    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < DK, o_v < DV
    m_kv = m_k[:, None] & m_v[None, :]
    p_h = o_k[:, None] * DV + o_v[None, :]
    if USE_INITIAL_STATE:
        b_h = tl.load(h0 + i_nh * DK * DV + p_h, mask=m_kv, other=0).to(tl.float32)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)

    for i_t in tl.range(0, tl.cdiv(Tn, BT), num_stages=NUM_STAGES):
        # int64: B * Hv * chunks * Dk * Dv passes 2^31 at 64k tokens x 8 sequences
        tl.store(h + (hc0 + i_t).to(tl.int64) * (DK * DV) + p_h, b_h.to(h.dtype.element_ty), mask=m_kv)
        o_r = i_t * BT + o_t
        m_r = o_r < Tn
        m_rk, m_rv = m_r[:, None] & m_k[None, :], m_r[:, None] & m_v[None, :]
        b_w = tl.load(w + (r0 + o_r[:, None]) * DK + o_k[None, :], mask=m_rk, other=0)
        b_u = tl.load(u + (r0 + o_r[:, None]) * DV + o_v[None, :], mask=m_rv, other=0).to(tl.float32)
        if HALF_DOTS:
            b_vn = b_u - _dot(b_w, b_h.to(w.dtype.element_ty), IEEE)
        else:
            b_vn = b_u - _dot(b_w.to(tl.float32), b_h, IEEE)
        tl.store(v_new + (r0 + o_r[:, None]) * DV + o_v[None, :], b_vn.to(v_new.dtype.element_ty), mask=m_rv)

        # kscale (wy.py) = L2-norm factor * exp(G_last - G): no row reduction in the loop,
        # which took ~200 bytes of spills per thread at BV=32, 4 warps (sm_90 compile report)
        b_ks = tl.load(kscale + r0 + o_r, mask=m_r, other=0)
        b_Gl = tl.load(gcum + r0 + tl.minimum(i_t * BT + BT, Tn) - 1)
        b_k = tl.load(k + ((bos + o_r[:, None]) * HK + i_hk) * DK + o_k[None, :], mask=m_rk, other=0)
        b_kd = b_k.to(tl.float32) * b_ks[:, None]
        b_h = b_h * tl.exp(b_Gl) + _dot(tl.trans(b_kd), b_vn, IEEE)

    tl.store(ht + i_nh * DK * DV + p_h, b_h, mask=m_kv)


def chunk_offsets(cu_seqlens: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """[N] int32: index of each packed sequence's first chunk (the chunks of all sequences in order)."""
    n = (cu_seqlens[1:] - cu_seqlens[:-1] + chunk - 1) // chunk
    return (torch.cumsum(n, 0) - n).to(torch.int32).contiguous()


def chunk_state_fwd(k, w, u, gcum, kscale, initial_state, cu_seqlens=None, chunk_idx=None,
                    final_state=None, state_dtype=None, vnew_dtype=None, block_v=None,
                    num_warps=None, num_stages=None, half_dots=None):
    """Launch the sequential state kernel.

    Args:
        k [B, T, Hk, Dk] (kernel dtype); w [B, Hv, T, Dk], u [B, Hv, T, Dv], gcum [B, Hv, T] and
        kscale [B, Hv, T] from wy.chunk_wy_fwd(store_kscale=True); initial_state
        [N, Hv, Dk, Dv] fp32 or None; cu_seqlens [N + 1] int32 and chunk_idx [NT, 2] int32
        (utils.chunk_indices) when packed (B = 1).
        state_dtype: dtype of the stored per-chunk states (default: k's, fp32 for fp32 inputs).
        vnew_dtype: dtype of the stored v_new (default fp32: rounding it to bf16 feeds straight
            into o through the causal q.k product).
        block_v / num_warps / num_stages / half_dots: launch parameters (defaults below).
    Returns:
        h [B, Hv, NT, Dk, Dv] (the state entering each chunk; NT = chunks per row, all packed
        sequences' chunks in order when packed), v_new [B, Hv, T, Dv], final_state
        [N, Hv, Dk, Dv] fp32.
    """
    B, T, Hk, Dk = k.shape
    Hv, Dv = u.shape[1], u.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    NTT = triton.cdiv(T, CHUNK) if cu_seqlens is None else chunk_idx.shape[0]
    offsets = None if cu_seqlens is None else chunk_offsets(cu_seqlens)
    if state_dtype is None:
        state_dtype = k.dtype
    if vnew_dtype is None:
        vnew_dtype = torch.float32
    h = torch.empty(B, Hv, NTT, Dk, Dv, dtype=state_dtype, device=u.device)
    v_new = torch.empty(B, Hv, T, Dv, dtype=vnew_dtype, device=u.device)
    ht = final_state if final_state is not None else torch.empty(
        N, Hv, Dk, Dv, dtype=torch.float32, device=u.device)
    few = N * Hv * triton.cdiv(Dv, 64) < 2 * num_sms(u.device)
    # Not yet measured. The fused walk's best block shapes (run 1 sweep), at 2 stages: 3 spill
    # 0.8 KB per thread at BV=32 (sm_90 compile report, Triton 3.9, Dk = Dv = 128, bf16).
    # BV=16 (256 programs at B=1 Hv=32, two per SM, no spills) would read w and k from L2 8 times
    # per chunk and head, ~2.9 GB at T=16384, likely L2-bound; bench_kernels.py times it.
    if block_v is None:
        block_v = 32 if few else 64
    if num_warps is None:
        num_warps = 4 if block_v <= 32 else 8
    if num_stages is None:
        num_stages = 2
    if half_dots is None:
        half_dots = k.dtype != torch.float32
    BV = max(min(block_v, next_pow2(Dv)), 16)
    BK = max(next_pow2(Dk), 16)
    key = (BK, BV, k.dtype, state_dtype, vnew_dtype, num_warps, num_stages, half_dots)
    stages = _STAGES_THAT_FIT.get(key, num_stages)
    while True:
        try:
            chunk_state_fwd_kernel[(triton.cdiv(Dv, BV), N * Hv)](
                k, w, u, gcum, kscale, initial_state, h, v_new, ht, cu_seqlens, offsets, T, NTT,
                HK=Hk, HV=Hv, DK=Dk, DV=Dv, BK=BK, BV=BV,
                USE_INITIAL_STATE=initial_state is not None,
                IS_VARLEN=cu_seqlens is not None, IEEE=k.dtype == torch.float32,
                NUM_STAGES=stages, HALF_DOTS=half_dots, num_warps=num_warps,
            )
            break
        except Exception as exc:
            # deeper prefetch can outgrow shared memory (large Dk, fp32): fall back to fewer
            # stages rather than fail; remembered per configuration
            if type(exc).__name__ != "OutOfResources" or stages <= 1:
                raise
            stages -= 1
    _STAGES_THAT_FIT[key] = stages
    return h, v_new, ht


_STAGES_THAT_FIT: dict = {}
