"""Chunk-local half of the chunked gated delta rule: everything that does not need the state.

Per chunk of 64 tokens and value head (one program each), from k, v, g (or the raw gates), beta:

    G      = cumsum(g) inside the chunk                                  gcum [B, Hv, T]    fp32
    A      = strictly_lower(beta_i k_i.k_j exp(G_i - G_j))               (64 x 64, registers)
    X      = (I + A)^-1: 16 x 16 diagonal blocks by forward substitution, merged by four 64^3
             products (_unit_lower_inverse)
    w      = X (beta exp(G) k)                                           w    [B, Hv, T, Dk] dtype
    u      = X (beta v)                                                  u    [B, Hv, T, Dv] fp32
    Aqk    = scale * lower(q_i.k_j exp(G_i - G_j)), diagonal included    Aqk  [B, Hv, T, 64] fp32

u and Aqk stay fp32: rounding either to bf16 costs 0.3-0.5e-2 of the 1e-2 relative-RMS budget
of a bf16 output (measured under the interpreter); w in bf16 costs ~1e-4.

The intermediates are head-major so a chunk is one contiguous tile for the sequential kernel
(chunk.py). With cu_seqlens (B = 1) T is the packed length and chunks never straddle sequences.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from gdn_kernels.utils import CHUNK, next_pow2


# Triton's CPU interpreter (3.9) returns garbage from bf16 x bf16 tl.dot: there, 16-bit operands
# are widened first (their values are unchanged, so the result is what the GPU computes).
_UPCAST_DOT = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    # fp32 inputs must stay exact (the 2e-3 bound); half inputs take TF32 / bf16 tensor cores.
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    elif _UPCAST_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32")
    else:
        return tl.dot(a, b, input_precision="tf32")


@triton.jit
def _gates(p_g, p_beta, p_a, p_b, A_log, dt_bias, i_h, o_r, n_rows, HV: tl.constexpr,
           USE_GATE: tl.constexpr):
    # Rows o_r (< n_rows valid) of g and beta; padded rows get g = 0, beta = 0 (no write, no decay).
    m_r = o_r < n_rows
    if USE_GATE:
        b_a = tl.load(p_a + o_r * HV, mask=m_r, other=0).to(tl.float32) + tl.load(dt_bias + i_h).to(tl.float32)
        b_sp = tl.where(b_a > 20.0, b_a, tl.log(1.0 + tl.exp(tl.minimum(b_a, 20.0))))
        b_g = -tl.exp(tl.load(A_log + i_h).to(tl.float32)) * b_sp
        b_beta = tl.sigmoid(tl.load(p_b + o_r * HV, mask=m_r, other=0).to(tl.float32))
    else:
        b_g = tl.load(p_g + o_r * HV, mask=m_r, other=0).to(tl.float32)
        b_beta = tl.load(p_beta + o_r * HV, mask=m_r, other=0).to(tl.float32)
    return tl.where(m_r, b_g, 0.0), tl.where(m_r, b_beta, 0.0)


@triton.jit
def _load_rows(p, o_r, n_rows, stride, D: tl.constexpr, BD: tl.constexpr, L2NORM: tl.constexpr):
    o_d = tl.arange(0, BD)
    m = (o_r[:, None] < n_rows) & (o_d[None, :] < D)
    b = tl.load(p + o_r[:, None] * stride + o_d[None, :], mask=m, other=0).to(tl.float32)
    if L2NORM:
        b = b * tl.rsqrt(tl.sum(b * b, 1) + 1e-6)[:, None]
    return b


@triton.jit
def _diagonal_block_inverses(A):
    # (I + L)^-1 for the four 16 x 16 diagonal blocks L of the strictly lower A [64, 64], by forward
    # substitution (row i = -L_i - sum_j L_ij row j), the four blocks side by side; exact fp32.
    # Returned as a block-diagonal [64, 64].
    o4 = tl.arange(0, 4)
    o16 = tl.arange(0, 16)
    same = o4[:, None, None, None] == o4[None, None, :, None]
    L = tl.sum(tl.where(same, tl.reshape(A, [4, 16, 4, 16]), 0.0), 2)   # [4, 16, 16]
    Y = -L   # rows below the current one still hold -L_j; they meet zero coefficients
    for i in tl.static_range(2, 16):
        row = (o16 == i)[None, :, None]
        a_i = -tl.sum(tl.where(row, L, 0.0), 1)                            # [4, 16]
        a_i += tl.sum(a_i[:, :, None] * Y, 1)
        Y = tl.where(row, a_i[:, None, :], Y)
    Y += (o16[:, None] == o16[None, :]).to(tl.float32)[None, :, :]
    return tl.reshape(tl.where(same, Y[:, :, None, :], 0.0), [64, 64])


@triton.jit
def _unit_lower_inverse(A, IEEE: tl.constexpr):
    # (I + A)^-1 for strictly lower A [64, 64]. With D the block-diagonal part (16 x 16 blocks) and
    # Xd = (I + D)^-1: I + A = (I + D)(I + N), N = Xd (A - D) strictly block lower, N^4 = 0, so
    #     (I + A)^-1 = (I - N)(I + N^2) Xd        (four 64^3 products).
    # Products of powers of A itself, (I - A)(I + A^2)...(I + A^32), cancel catastrophically when
    # keys are correlated (post-conv SiLU keys), in TF32 and in fp32 alike; the entries of Xd and
    # N stay bounded, so this keeps < 1e-3 in TF32 (benchmarks/inverse_stability.py).
    o_t = tl.arange(0, 64)
    eye = (o_t[:, None] == o_t[None, :]).to(tl.float32)
    Xd = _diagonal_block_inverses(A)
    N = _dot(Xd, tl.where(o_t[:, None] // 16 > o_t[None, :] // 16, A, 0.0), IEEE)
    M = _dot(eye - N, eye + _dot(N, N, IEEE), IEEE)
    return _dot(M, Xd, IEEE)


# T is left unspecialised: one compiled kernel serves every length.
@triton.jit(do_not_specialize=["T"])
def chunk_wy_fwd_kernel(
    q, k, v, g, beta, a, b, A_log, dt_bias,
    w, u, Aqk, gcum,
    cu_seqlens, chunk_indices,
    scale, T,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    USE_L2NORM: tl.constexpr, USE_GATE: tl.constexpr, IS_VARLEN: tl.constexpr, IEEE: tl.constexpr,
):
    BT: tl.constexpr = 64
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // HV, i_bh % HV
    i_hk = i_h // (HV // HK)
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_t * 2)
        i_t = tl.load(chunk_indices + i_t * 2 + 1)
        bos, eos = tl.load(cu_seqlens + i_n), tl.load(cu_seqlens + i_n + 1)
    else:
        bos, eos = i_b * T, i_b * T + T
    t0 = bos + i_t * BT            # first token of the chunk, in the flattened [B * T] token axis
    n_rows = tl.minimum(eos - t0, BT)
    r0 = i_bh * T + t0 - i_b * T   # its row in the head-major intermediates

    p_q = q + (t0 * HK + i_hk) * DK
    p_k = k + (t0 * HK + i_hk) * DK
    p_v = v + (t0 * HV + i_h) * DV
    o_t = tl.arange(0, BT)
    m_t = o_t < n_rows
    b_g, b_beta = _gates(g + t0 * HV + i_h, beta + t0 * HV + i_h, a + t0 * HV + i_h, b + t0 * HV + i_h,
                         A_log, dt_bias, i_h, o_t, n_rows, HV, USE_GATE)
    b_G = tl.cumsum(b_g, 0)
    tl.store(gcum + r0 + o_t, b_G, mask=m_t)
    m_low = o_t[:, None] > o_t[None, :]
    m_causal = o_t[:, None] >= o_t[None, :]
    # exp only where i >= j: above the diagonal G_i - G_j > 0 could overflow
    b_decay = tl.exp(tl.where(m_causal, b_G[:, None] - b_G[None, :], 0.0))

    b_k = _load_rows(p_k, o_t, n_rows, HK * DK, DK, BK, USE_L2NORM)
    b_q = _load_rows(p_q, o_t, n_rows, HK * DK, DK, BK, USE_L2NORM)
    b_Aqk = tl.where(m_causal, _dot(b_q, tl.trans(b_k), IEEE) * b_decay * scale, 0.0)
    tl.store(Aqk + (r0 + o_t[:, None]) * BT + o_t[None, :], b_Aqk.to(Aqk.dtype.element_ty),
             mask=m_t[:, None])

    b_A = tl.where(m_low, _dot(b_k, tl.trans(b_k), IEEE) * b_decay * b_beta[:, None], 0.0)
    b_X = _unit_lower_inverse(b_A, IEEE)

    o_k = tl.arange(0, BK)
    b_w = _dot(b_X, b_k * (b_beta * tl.exp(b_G))[:, None], IEEE)
    tl.store(w + (r0 + o_t[:, None]) * DK + o_k[None, :], b_w.to(w.dtype.element_ty),
             mask=m_t[:, None] & (o_k[None, :] < DK))
    for i_v in tl.static_range(0, DV, BV):
        o_v = i_v + tl.arange(0, BV)
        b_v = _load_rows(p_v + i_v, o_t, n_rows, HV * DV, DV - i_v, BV, False)
        b_u = _dot(b_X, b_v * b_beta[:, None], IEEE)
        tl.store(u + (r0 + o_t[:, None]) * DV + o_v[None, :], b_u.to(u.dtype.element_ty),
                 mask=m_t[:, None] & (o_v[None, :] < DV))


def chunk_wy_fwd(q, k, v, g, beta, scale, use_qk_l2norm, cu_seqlens=None, chunk_idx=None,
                 gates=None, num_warps=4, block_v=64):
    """Launch the chunk-local kernel.

    Args:
        q, k [B, T, Hk, Dk], v [B, T, Hv, Dv] (one dtype, contiguous); g [B, T, Hv] fp32 and
        beta [B, T, Hv], or gates = (a [B, T, Hv], b [B, T, Hv], A_log [Hv], dt_bias [Hv]) with
        g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b) computed in the kernel.
        cu_seqlens [N + 1] int32 and chunk_idx [NT, 2] int32 (utils.chunk_indices) when packed.
        block_v: width of the value blocks u is computed in.
    Returns:
        w [B, Hv, T, Dk] in v's dtype; u [B, Hv, T, Dv], Aqk [B, Hv, T, 64] and gcum [B, Hv, T]
        fp32.
    """
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[2], v.shape[3]
    w = v.new_empty(B, Hv, T, Dk)
    u = v.new_empty(B, Hv, T, Dv, dtype=torch.float32)
    Aqk = v.new_empty(B, Hv, T, CHUNK, dtype=torch.float32)
    gcum = torch.empty(B, Hv, T, dtype=torch.float32, device=v.device)
    NT = chunk_idx.shape[0] if cu_seqlens is not None else triton.cdiv(T, CHUNK)
    a, b, A_log, dt_bias = gates if gates is not None else (g, beta, g, g)
    BV = min(next_pow2(Dv), block_v)
    chunk_wy_fwd_kernel[(NT, B * Hv)](
        q, k, v, g if gates is None else a, beta if gates is None else b, a, b, A_log, dt_bias,
        w, u, Aqk, gcum,
        cu_seqlens, chunk_idx, scale, T,
        HK=Hk, HV=Hv, DK=Dk, DV=Dv, BK=max(next_pow2(Dk), 16), BV=max(BV, 16),
        USE_L2NORM=use_qk_l2norm, USE_GATE=gates is not None, IS_VARLEN=cu_seqlens is not None,
        IEEE=v.dtype == torch.float32, num_warps=num_warps,
    )
    return w, u, Aqk, gcum
