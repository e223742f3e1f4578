"""Split prefill (impl="split"), part 3 of 3: the output of every chunk, all in parallel.

One program per (chunk, batch x value head), from the state entering the chunk h_c and the
corrected values v_new (chunk_state.py):

    A = scale * lower(q_i.k_j exp(G_i - G_j)), diagonal included       (64 x 64, registers)
    o = (scale q exp(G)) h_c + A v_new

A is recomputed here from q and k (one 64 x 64 x Dk product per chunk) instead of being written
by wy.py and read back (2 x 16 KiB fp32 per chunk and head), or read from wy.py's Aqk when given.
The value axis is walked in BV-wide blocks inside the program so that A is built once.
Products: exact fp32 for fp32 inputs; for 16-bit inputs q h_c on the input dtype's tensor cores
(as the fused walk does), q.k and A v_new on TF32 with fp32 operands.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn_kernels.utils import next_pow2
from gdn_kernels.wy import _dot, _load_rows


# T and the chunk count are left unspecialised: one compiled kernel serves every length.
@triton.jit(do_not_specialize=["T", "NTT"])
def chunk_output_fwd_kernel(
    q, k, v_new, gcum, h, Aqk, o,
    cu_seqlens, chunk_indices,
    scale, T, NTT,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    USE_L2NORM: tl.constexpr, IS_VARLEN: tl.constexpr, IEEE: tl.constexpr,
    HALF_DOTS: tl.constexpr, LOAD_AQK: tl.constexpr,
):
    BT: tl.constexpr = 64
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // HV, i_bh % HV
    i_hk = i_h // (HV // HK)
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_c * 2)
        i_t = tl.load(chunk_indices + i_c * 2 + 1)
        bos, eos = tl.load(cu_seqlens + i_n), tl.load(cu_seqlens + i_n + 1)
    else:
        i_t = i_c
        bos, eos = i_b * T, i_b * T + T
    t0 = bos + i_t * BT            # first token of the chunk, in the flattened [B * T] token axis
    n_rows = tl.minimum(eos - t0, BT)
    r0 = i_bh * T + t0 - i_b * T   # its row in the head-major intermediates
    # the chunk's state: chunks of packed sequences are numbered in order, like the grid
    p_hc = h + (i_bh * NTT + i_c).to(tl.int64) * (DK * DV)

    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m_t, m_k = o_t < n_rows, o_k < DK
    b_G = tl.load(gcum + r0 + o_t, mask=m_t, other=0)
    b_q = _load_rows(q + (t0 * HK + i_hk) * DK, o_t, n_rows, HK * DK, DK, BK, USE_L2NORM)
    if LOAD_AQK:
        b_A = tl.load(Aqk + (r0 + o_t[:, None]) * BT + o_t[None, :], mask=m_t[:, None], other=0)
    else:
        m_causal = o_t[:, None] >= o_t[None, :]
        b_k = _load_rows(k + (t0 * HK + i_hk) * DK, o_t, n_rows, HK * DK, DK, BK, USE_L2NORM)
        # exp only where i >= j: above the diagonal G_i - G_j > 0 could overflow
        b_decay = tl.exp(tl.where(m_causal, b_G[:, None] - b_G[None, :], 0.0))
        b_A = tl.where(m_causal, _dot(b_q, tl.trans(b_k), IEEE) * b_decay * scale, 0.0)
    b_qs = b_q * (scale * tl.exp(b_G))[:, None]
    if HALF_DOTS:
        b_qs = b_qs.to(q.dtype.element_ty)

    for i_v in tl.static_range(0, DV, BV):
        o_v = i_v + tl.arange(0, BV)
        m_v = o_v < DV
        b_h = tl.load(p_hc + o_k[:, None] * DV + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0)
        b_vn = tl.load(v_new + (r0 + o_t[:, None]) * DV + o_v[None, :], mask=m_t[:, None] & m_v[None, :],
                       other=0).to(tl.float32)
        if HALF_DOTS:
            b_o = _dot(b_qs, b_h.to(q.dtype.element_ty), IEEE)
        else:
            b_o = _dot(b_qs, b_h.to(tl.float32), IEEE)
        b_o += _dot(b_A, b_vn, IEEE)
        tl.store(o + ((t0 + o_t[:, None]) * HV + i_h) * DV + o_v[None, :], b_o.to(o.dtype.element_ty),
                 mask=m_t[:, None] & m_v[None, :])


def chunk_output_fwd(q, k, v_new, gcum, h, scale, use_qk_l2norm, cu_seqlens=None, chunk_idx=None,
                     Aqk=None, out=None, block_v=None, num_warps=None, half_dots=None):
    """Launch the output kernel.

    Args:
        q, k [B, T, Hk, Dk] (kernel dtype); v_new [B, Hv, T, Dv] and h [B, Hv, NT, Dk, Dv] from
        chunk_state.chunk_state_fwd; gcum [B, Hv, T] fp32 from wy.chunk_wy_fwd; cu_seqlens
        [N + 1] int32 and chunk_idx [NT, 2] int32 (utils.chunk_indices) when packed (B = 1).
        Aqk [B, Hv, T, 64] fp32 from wy.chunk_wy_fwd, or None to recompute it here.
        out: optional preallocated o. block_v / num_warps / half_dots: launch parameters.
    Returns:
        o [B, T, Hv, Dv] in q's dtype.
    """
    B, T, Hk, Dk = q.shape
    Hv, Dv = v_new.shape[1], v_new.shape[3]
    NTT = h.shape[2]
    o = out if out is not None else q.new_empty(B, T, Hv, Dv)
    # Not yet measured: 8 warps is spill-free at every BV in the sm_90 compile report (4 warps
    # spills 120-370 B per thread); BV=64 keeps the q h and A v_new products 64 x 64.
    if block_v is None:
        block_v = 64
    if num_warps is None:
        num_warps = 8
    if half_dots is None:
        half_dots = q.dtype != torch.float32
    BV = max(min(block_v, next_pow2(Dv)), 16)
    BK = max(next_pow2(Dk), 16)
    chunk_output_fwd_kernel[(NTT, B * Hv)](
        q, k, v_new, gcum, h, Aqk if Aqk is not None else gcum, o, cu_seqlens, chunk_idx,
        scale, T, NTT,
        HK=Hk, HV=Hv, DK=Dk, DV=Dv, BK=BK, BV=BV,
        USE_L2NORM=use_qk_l2norm, IS_VARLEN=cu_seqlens is not None, IEEE=q.dtype == torch.float32,
        HALF_DOTS=half_dots, LOAD_AQK=Aqk is not None, num_warps=num_warps,
    )
    return o
