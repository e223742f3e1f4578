"""Chunked gated delta rule forward (prefill): the sequential half plus the public wrapper.

The chunk-local work (cumsum, (I + A)^-1, w, u, causal q.k) runs first in wy.py, for all chunks
at once. This kernel then walks the chunks of one sequence in order, one program per
(value block, sequence x value head), with the fp32 state block h [Dk, BV] in registers:

    v_new = u - w h                                   (this chunk's corrected values)
    o     = (scale q exp(G)) h + Aqk v_new            (written directly: no per-chunk h in memory)
    h     = exp(G_last) h + (k exp(G_last - G))^T v_new

so the states between chunks never leave the SM and the only traffic is q, k, w, u, Aqk in and o
out. Products: exact fp32 (ieee) for fp32 inputs. For 16-bit inputs w h and q h read the state
rounded to the input dtype (bf16/fp16 tensor cores), while Aqk v_new and the state update stay on
TF32 with fp32 operands: rounding v_new for the update alone cost ~6e-3 relative RMS of the final
state (of the 1e-2 budget), the rest costs ~4e-4 on o (measured under the interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn_kernels.utils import as_kernel_input, chunk_indices, next_pow2, num_sms, prepare_inputs
from gdn_kernels.wy import _dot, chunk_wy_fwd


# T is left unspecialised: one compiled kernel serves every length.
@triton.jit(do_not_specialize=["T"])
def chunk_state_output_fwd_kernel(
    q, k, w, u, Aqk, gcum, h0, o, ht,
    cu_seqlens,
    scale, T,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    USE_L2NORM: tl.constexpr, USE_INITIAL_STATE: tl.constexpr, IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr, NUM_STAGES: tl.constexpr, HALF_DOTS: tl.constexpr,
):
    BT: tl.constexpr = 64
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // HV, i_nh % HV
    i_hk = i_h // (HV // HK)
    if IS_VARLEN:
        i_b = 0
        bos, eos = tl.load(cu_seqlens + i_n), tl.load(cu_seqlens + i_n + 1)
    else:
        i_b = i_n
        bos, eos = i_n * T, i_n * T + T
    Tn = eos - bos
    r0 = (i_b * HV + i_h) * T + bos - i_b * T   # first row of this sequence in the intermediates

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
        o_r = i_t * BT + o_t
        m_r = o_r < Tn
        m_rk, m_rv = m_r[:, None] & m_k[None, :], m_r[:, None] & m_v[None, :]
        b_w = tl.load(w + (r0 + o_r[:, None]) * DK + o_k[None, :], mask=m_rk, other=0)
        b_u = tl.load(u + (r0 + o_r[:, None]) * DV + o_v[None, :], mask=m_rv, other=0).to(tl.float32)
        b_A = tl.load(Aqk + (r0 + o_r[:, None]) * BT + o_t[None, :], mask=m_r[:, None], other=0).to(tl.float32)
        b_G = tl.load(gcum + r0 + o_r, mask=m_r, other=0)
        b_Gl = tl.load(gcum + r0 + tl.minimum(i_t * BT + BT, Tn) - 1)
        p_qk = ((bos + o_r[:, None]) * HK + i_hk) * DK + o_k[None, :]
        b_q = tl.load(q + p_qk, mask=m_rk, other=0).to(tl.float32)
        b_k = tl.load(k + p_qk, mask=m_rk, other=0).to(tl.float32)
        if USE_L2NORM:
            b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, 1) + 1e-6)[:, None]
            b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, 1) + 1e-6)[:, None]

        if HALF_DOTS:
            # The two [64, Dk] x [Dk, BV] products read the state rounded to the input dtype
            # (costs ~4e-4 on o); the state update below stays TF32, because rounding v_new
            # and k there costs ~6e-3 on the final state (measured).
            dt = q.dtype.element_ty
            b_hd = b_h.to(dt)
            b_vn = b_u - _dot(b_w, b_hd, IEEE)
            b_o = _dot((b_q * (scale * tl.exp(b_G))[:, None]).to(dt), b_hd, IEEE) + _dot(b_A, b_vn, IEEE)
        else:
            b_vn = b_u - _dot(b_w.to(tl.float32), b_h, IEEE)
            b_o = _dot(b_q * (scale * tl.exp(b_G))[:, None], b_h, IEEE) + _dot(b_A, b_vn, IEEE)
        tl.store(o + ((bos + o_r[:, None]) * HV + i_h) * DV + o_v[None, :],
                 b_o.to(o.dtype.element_ty), mask=m_rv)
        b_kd = b_k * tl.exp(b_Gl - b_G)[:, None]
        b_h = b_h * tl.exp(b_Gl) + _dot(tl.trans(b_kd), b_vn, IEEE)

    tl.store(ht + i_nh * DK * DV + p_h, b_h, mask=m_kv)


def chunk_state_output_fwd(q, k, w, u, Aqk, gcum, initial_state, scale, use_qk_l2norm,
                           cu_seqlens=None, out=None, final_state=None, block_v=None,
                           num_warps=None, num_stages=None, half_dots=None):
    """Launch the sequential kernel; returns o [B, T, Hv, Dv] and final_state [N, Hv, Dk, Dv] fp32."""
    B, T, Hk, Dk = k.shape
    Hv, Dv = u.shape[1], u.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    o = out if out is not None else q.new_empty(B, T, Hv, Dv)
    ht = final_state if final_state is not None else torch.empty(
        N, Hv, Dk, Dv, dtype=torch.float32, device=u.device)
    few = N * Hv * triton.cdiv(Dv, 64) < 2 * num_sms(u.device)
    if block_v is None:
        # B = 1 prefill has only Hv sequential programs per 64 value columns: split the value
        # axis finer so that every SM gets one (run 1 sweep: BV=32 3 stages best at B=1, BV=64
        # 8 warps at B=8).
        block_v = 32 if few else 64
    if num_warps is None:
        num_warps = 4 if block_v <= 32 else 8
    if num_stages is None:
        num_stages = 3 if few else 2
    if half_dots is None:
        half_dots = q.dtype != torch.float32
    BV = max(min(block_v, next_pow2(Dv)), 16)
    BK = max(next_pow2(Dk), 16)
    key = (BK, BV, q.dtype, num_warps, num_stages, half_dots)
    stages = _STAGES_THAT_FIT.get(key, num_stages)
    while True:
        try:
            chunk_state_output_fwd_kernel[(triton.cdiv(Dv, BV), N * Hv)](
                q, k, w, u, Aqk, gcum, initial_state, o, ht, cu_seqlens, scale, T,
                HK=Hk, HV=Hv, DK=Dk, DV=Dv, BK=BK, BV=BV,
                USE_L2NORM=use_qk_l2norm, USE_INITIAL_STATE=initial_state is not None,
                IS_VARLEN=cu_seqlens is not None, IEEE=q.dtype == torch.float32,
                NUM_STAGES=stages, HALF_DOTS=half_dots, num_warps=num_warps,
            )
            break
        except Exception as exc:
            # Prefetching six tiles per stage can outgrow shared memory (large Dk, fp32): fall
            # back to fewer stages rather than fail; remembered per configuration.
            if type(exc).__name__ != "OutOfResources" or stages <= 1:
                raise
            stages -= 1
    _STAGES_THAT_FIT[key] = stages
    return o, ht


_STAGES_THAT_FIT: dict = {}


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor | None,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    gates: tuple | None = None,
    out: torch.Tensor | None = None,
    final_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked (WY) gated delta rule forward.

    Args:
        q, k: [B, T, Hk, Dk]. v: [B, T, Hv, Dv], Hv a multiple of Hk (key head h // (Hv // Hk)).
        g: [B, T, Hv] log decay (read as fp32). beta: [B, T, Hv].
        initial_state: [N, Hv, Dk, Dv] fp32 or None (zeros).
        scale: multiplies q (default Dk ** -0.5). use_qk_l2norm: L2-normalise q, k in the kernels.
        cu_seqlens: [N + 1] token offsets of packed sequences (B must be 1), or None.
        gates: (a, b, A_log, dt_bias) instead of g / beta (pass g = beta = None): a, b [B, T, Hv],
            A_log, dt_bias [Hv]; g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b).
        out, final_state: optional preallocated o / final_state to write into.
    Returns:
        o [B, T, Hv, Dv] in v's dtype (fp32 compute for float64), final_state [N, Hv, Dk, Dv] fp32.
    """
    q, k, v, g, beta, gates, scale, cu = prepare_inputs(q, k, v, g, beta, gates, scale, cu_seqlens)
    h0 = None if initial_state is None else as_kernel_input(initial_state, torch.float32)
    idx = None if cu is None else chunk_indices(cu)
    w, u, Aqk, gcum = chunk_wy_fwd(q, k, v, g, beta, scale, use_qk_l2norm, cu, idx, gates=gates)
    o, ht = chunk_state_output_fwd(q, k, w, u, Aqk, gcum, h0, scale, use_qk_l2norm, cu,
                                   out=out,
                                   final_state=final_state)
    return o, ht
