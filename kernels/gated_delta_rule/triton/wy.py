"""Chunk-local half of the chunked gated delta rule: everything that does not need the state.

Per chunk of 64 tokens and value head (one program each), from k, v, g (or the raw gates), beta:

    G      = cumsum(g) inside the chunk                                  gcum [B, Hv, T]    fp32
    A      = strictly_lower(beta_i k_i.k_j exp(G_i - G_j))               (64 x 64, registers)
    X      = (I + A)^-1: 16 x 16 diagonal blocks by forward substitution, merged by four 64^3
             products (_unit_lower_inverse)
    w      = X (beta exp(G) k)                                           w    [B, Hv, T, Dk] dtype
    u      = X (beta v)                                                  u    [B, Hv, T, Dv] fp32
    Aqk    = scale * lower(q_i.k_j exp(G_i - G_j)), diagonal included    Aqk  [B, Hv, T, 64] fp32
    fq, fk = scale exp(G) / ||q||, exp(G_last - G) / ||k||               [B, Hv, T]         fp32

(q and k L2-normalised when asked.) For 16-bit inputs (head dims multiples of 64, see
utils.raw_operands; otherwise every operand is an fp32 copy on TF32) q, k and v are tensor-core
operands as they come (exact); norms, decays, beta and scale are row or column factors of the
fp32 products, and an fp32 matrix meets a 16-bit one as two 16-bit halves (_halves, ~16 mantissa
bits), so nothing is rounded to 16 bits on the way except w (costs ~1e-4). u and Aqk stay fp32:
rounding either to bf16 costs 0.3-0.5e-2 of the 1e-2 relative-RMS budget of a bf16 output
(interpreter). fq and fk let chunk.py use the raw q and k too.

The intermediates are head-major so a chunk is one contiguous tile for the sequential kernel
(chunk.py). With cu_seqlens (B = 1) T is the packed length and chunks never straddle sequences.

chunk_inverse_fwd runs the same kernel for chunk.py's fused form (INVERSE): it stores X diag(beta)
[B, Hv, T, 64] fp32, gcum and the norms' row factors scale / ||q||, 1 / ||k||, and nothing else.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from kernels.triton_utils import CHUNK, cdiv, dot, launch_fitting, next_pow2, raw_operands, token_strides


@triton.jit
def _gates(p_g, p_beta, p_a, p_b, A_log, dt_bias, i_h, o_r, n_rows, HV, USE_GATE: tl.constexpr):
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
def _load_raw(p, o_r, n_rows, stride, D: tl.constexpr, BD: tl.constexpr, SPLIT: tl.constexpr):
    # Rows o_r of a [*, D] tile (padded rows and columns read 0): in the input dtype with SPLIT,
    # else in fp32 (all products then take fp32 operands).
    o_d = tl.arange(0, BD)
    x = tl.load(p + o_r[:, None] * stride + o_d[None, :], mask=(o_r[:, None] < n_rows) & (o_d[None, :] < D),
                other=0)
    if SPLIT:
        return x
    else:
        return x.to(tl.float32)


@triton.jit
def _inv_norm(x, L2NORM: tl.constexpr):
    # 1 / ||row|| (the in-kernel L2 norm as a row factor, so the 16-bit operand stays exact), or 1.
    if L2NORM:
        xf = x.to(tl.float32)
        return tl.rsqrt(tl.sum(xf * xf, 1) + 1e-6)
    else:
        return tl.full([x.shape[0]], 1.0, tl.float32)


@triton.jit
def _halves(a, dt: tl.constexpr, SPLIT: tl.constexpr):
    # With SPLIT, fp32 a as hi + lo, both in the 16-bit dtype dt: ~16 bits of a's mantissa survive
    # (TF32 keeps 10), so an fp32 factor can meet a 16-bit tile on that dtype's tensor cores in two
    # products. Without, a itself (the lo half is never read then).
    if SPLIT:
        hi = a.to(dt)
        return hi, (a - hi.to(tl.float32)).to(dt)
    else:
        return a, a


@triton.jit
def _dot_halves(hi, lo, b, IEEE: tl.constexpr, SPLIT: tl.constexpr):
    # (hi + lo) b for (hi, lo) from _halves, fp32 accumulation; without SPLIT the one product hi b.
    if SPLIT:
        return dot(hi, b, IEEE) + dot(lo, b, IEEE)
    else:
        return dot(hi, b, IEEE)


@triton.jit
def dot_split(a, b, IEEE: tl.constexpr, SPLIT: tl.constexpr):
    # fp32 a times b (a raw 16-bit tile with SPLIT, so b needs no fp32 copy in registers).
    hi, lo = _halves(a, b.dtype, SPLIT)
    return _dot_halves(hi, lo, b, IEEE, SPLIT)


@triton.jit
def dot_split_right(a, b, IEEE: tl.constexpr, SPLIT: tl.constexpr):
    # a times fp32 b (a raw 16-bit tile with SPLIT): dot_split with the split operand on the right.
    if SPLIT:
        hi, lo = _halves(b, a.dtype, SPLIT)
        return dot(a, hi, IEEE) + dot(a, lo, IEEE)
    else:
        return dot(a, b, IEEE)


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
    # N stay bounded, so this keeps < 1e-3 in TF32 (benchmarks/investigations/inverse_stability.py).
    o_t = tl.arange(0, 64)
    Xd = _diagonal_block_inverses(A)
    N = dot(Xd, tl.where(o_t[:, None] // 16 > o_t[None, :] // 16, A, 0.0), IEEE)
    # (I - N)(I + N^2) Xd = Y - N Y with Y = Xd + N (N Xd): no identity or extra temporaries live
    Y = Xd + dot(N, dot(N, Xd, IEEE), IEEE)
    return Y - dot(N, Y, IEEE)


# T and the head counts are left unspecialised: one compiled kernel serves every length and every
# Hk / Hv of a head size (they only index programs and rows).
@triton.jit(do_not_specialize=["T", "HK", "HV"])
def chunk_wy_fwd_kernel(
    q, k, v, g, beta, a, b, A_log, dt_bias,
    w, u, Aqk, gcum, fq, fk,
    cu_seqlens, chunk_indices,
    scale, T, sq, sk, sv,
    HK, HV, DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    USE_L2NORM: tl.constexpr, USE_GATE: tl.constexpr, IS_VARLEN: tl.constexpr, IEEE: tl.constexpr,
    SPLIT: tl.constexpr, INVERSE: tl.constexpr = False,
):
    # sq, sk, sv: elements between consecutive tokens of q, k, v (utils.token_stride)
    # INVERSE: store Xb = (I + A)^-1 diag(beta) into Aqk's place, gcum, and scale / ||q||, 1 / ||k|| into
    # fq's and fk's (no w, u: chunk.chunk_fused_fwd_kernel forms them from q, k, v per chunk)
    BT: tl.constexpr = 64
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // HV, i_bh % HV
    i_hk = i_h // (HV // HK)
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_t * 2)
        if i_n < 0:  # a padding row of utils.chunk_indices
            return
        i_t = tl.load(chunk_indices + i_t * 2 + 1)
        bos, eos = tl.load(cu_seqlens + i_n), tl.load(cu_seqlens + i_n + 1)
    else:
        bos, eos = i_b * T, i_b * T + T
    t0 = bos + i_t * BT            # first token of the chunk, in the flattened [B * T] token axis
    n_rows = tl.minimum(eos - t0, BT)
    r0 = i_bh * T + t0 - i_b * T   # its row in the head-major intermediates

    t64 = t0.to(tl.int64)  # strided q / k / v of a large batch pass 2**31 elements
    p_q = q + t64 * sq + i_hk * DK
    p_k = k + t64 * sk + i_hk * DK
    p_v = v + t64 * sv + i_h * DV
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

    # q and k stay in the input dtype (exact tensor-core operands); their L2 norms, the decays,
    # beta and scale are row / column factors applied to the fp32 products.
    b_k = _load_raw(p_k, o_t, n_rows, sk, DK, BK, SPLIT)
    b_rk = _inv_norm(b_k, USE_L2NORM)
    if INVERSE:
        # the row factors scale / ||q|| and 1 / ||k||, so the sequential kernel keeps q and k out of
        # registers (tensor-core operands only)
        if USE_L2NORM:
            b_rq = _inv_norm(_load_raw(p_q, o_t, n_rows, sq, DK, BK, SPLIT), USE_L2NORM)
        else:
            b_rq = b_rk
        tl.store(fq + r0 + o_t, scale * b_rq, mask=m_t)
        tl.store(fk + r0 + o_t, b_rk, mask=m_t)
    else:
        b_q = _load_raw(p_q, o_t, n_rows, sq, DK, BK, SPLIT)
        b_rq = _inv_norm(b_q, USE_L2NORM)
        tl.store(fq + r0 + o_t, scale * b_rq * tl.exp(b_G), mask=m_t)
        # padded rows have g = 0, so the chunk's last G is the sum of all its g
        tl.store(fk + r0 + o_t, b_rk * tl.exp(tl.sum(b_g, 0) - b_G), mask=m_t)
        b_Aqk = dot(b_q, tl.trans(b_k), IEEE) * (b_rq * scale)[:, None] * b_rk[None, :]
        tl.store(Aqk + (r0 + o_t[:, None]) * BT + o_t[None, :], tl.where(m_causal, b_Aqk * b_decay, 0.0),
                 mask=m_t[:, None])

    b_A = dot(b_k, tl.trans(b_k), IEEE) * (b_rk * b_beta)[:, None] * b_rk[None, :]
    b_X = _unit_lower_inverse(tl.where(m_low, b_A * b_decay, 0.0), IEEE)
    if INVERSE:
        # beta folded into X's columns (padded columns have beta = 0). Triton compiles the branch not
        # taken after an early return as well, so the w / u stores below sit in the else branch.
        tl.store(Aqk + (r0 + o_t[:, None]) * BT + o_t[None, :], b_X * b_beta[None, :], mask=m_t[:, None])
    else:
        # w = X diag(beta exp(G) rk) k and u = X diag(beta) v: the diagonals folded into X's columns,
        # and both in column blocks of BV (k and v re-read from cache) to bound the live registers
        dt = w.dtype.element_ty
        hi, lo = _halves(b_X * (b_beta * tl.exp(b_G) * b_rk)[None, :], dt, SPLIT)
        for i_k in tl.static_range(0, DK, BV):
            o_k = i_k + tl.arange(0, BV)
            b_kc = _load_raw(p_k + i_k, o_t, n_rows, sk, DK - i_k, BV, SPLIT)
            b_w = _dot_halves(hi, lo, b_kc, IEEE, SPLIT)
            tl.store(w + (r0 + o_t[:, None]) * DK + o_k[None, :], b_w.to(dt),
                     mask=m_t[:, None] & (o_k[None, :] < DK))
        hi, lo = _halves(b_X * b_beta[None, :], dt, SPLIT)
        for i_v in tl.static_range(0, DV, BV):
            o_v = i_v + tl.arange(0, BV)
            b_vc = _load_raw(p_v + i_v, o_t, n_rows, sv, DV - i_v, BV, SPLIT)
            b_u = _dot_halves(hi, lo, b_vc, IEEE, SPLIT)
            tl.store(u + (r0 + o_t[:, None]) * DV + o_v[None, :], b_u,
                     mask=m_t[:, None] & (o_v[None, :] < DV))


def chunk_inverse_fwd(q, k, v, g, beta, scale, use_qk_l2norm, cu_seqlens=None, chunk_idx=None, gates=None,
                      num_warps=4):
    """Launch the chunk-local kernel for the fused form (chunk.chunk_fused_fwd): the inverse only.

    Args: as chunk_wy_fwd (v [B, T, Hv, Dv] gives Hv and Dv; its values are not read).
    Returns:
        X [B, Hv, T, 64] fp32, each chunk's rows (I + A)^-1 diag(beta) (zero past the chunk's last
        token); gcum [B, Hv, T], the cumulative log decay inside each chunk; rq = scale / ||q|| and
        rk = 1 / ||k|| [B, Hv, T] (scale and 1 without use_qk_l2norm); all fp32.
    """
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[2], v.shape[3]
    sq, sk = token_strides(q, k)
    X = v.new_empty(B, Hv, T, CHUNK, dtype=torch.float32)
    gcum, rq, rk = torch.empty(3, B, Hv, T, dtype=torch.float32, device=v.device).unbind(0)
    NT = chunk_idx.shape[0] if cu_seqlens is not None else cdiv(T, CHUNK)
    a, b, A_log, dt_bias = gates if gates is not None else (g, beta, g, g)
    chunk_wy_fwd_kernel[(NT, B * Hv)](
        q, k, v, g if gates is None else a, beta if gates is None else b, a, b, A_log, dt_bias,
        X, X, X, gcum, rq, rk,
        cu_seqlens, chunk_idx, scale, T, sq, sk, sk,
        HK=Hk, HV=Hv, DK=Dk, DV=Dv, BK=max(next_pow2(Dk), 16), BV=16,
        USE_L2NORM=use_qk_l2norm, USE_GATE=gates is not None, IS_VARLEN=cu_seqlens is not None,
        IEEE=v.dtype == torch.float32, SPLIT=raw_operands(v.dtype, Dk, Dv), INVERSE=True, num_warps=num_warps,
    )
    return X, gcum, rq, rk


def chunk_wy_fwd(q, k, v, g, beta, scale, use_qk_l2norm, cu_seqlens=None, chunk_idx=None,
                 gates=None, num_warps=4, block_v=64):
    """Launch the chunk-local kernel.

    Args:
        q, k [B, T, Hk, Dk], v [B, T, Hv, Dv] (one dtype; contiguous, or with a token stride:
        utils.token_stride); g [B, T, Hv] fp32 and
        beta [B, T, Hv], or gates = (a [B, T, Hv], b [B, T, Hv], A_log [Hv], dt_bias [Hv]) with
        g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b) computed in the kernel.
        cu_seqlens [N + 1] int32 and chunk_idx [NT, 2] int32 (utils.chunk_indices: padding rows
            (-1, 0) are skipped) when packed.
        block_v: width of the column blocks w and u are computed in.
    Returns:
        w [B, Hv, T, Dk] in v's dtype; u [B, Hv, T, Dv], Aqk [B, Hv, T, 64], gcum [B, Hv, T] and the
        row factors fq = scale exp(G) / ||q||, fk = exp(G_last - G) / ||k|| [B, Hv, T], all fp32.
    """
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[2], v.shape[3]
    sq, sk, sv = token_strides(q, k, v)
    w = v.new_empty(B, Hv, T, Dk)
    u = v.new_empty(B, Hv, T, Dv, dtype=torch.float32)
    Aqk = v.new_empty(B, Hv, T, CHUNK, dtype=torch.float32)
    gcum, fq, fk = torch.empty(3, B, Hv, T, dtype=torch.float32, device=v.device).unbind(0)
    NT = chunk_idx.shape[0] if cu_seqlens is not None else cdiv(T, CHUNK)
    a, b, A_log, dt_bias = gates if gates is not None else (g, beta, g, g)
    key = (Dk, Dv, v.dtype, block_v, num_warps)

    def launch(BV):
        chunk_wy_fwd_kernel[(NT, B * Hv)](
            q, k, v, g if gates is None else a, beta if gates is None else b, a, b, A_log, dt_bias,
            w, u, Aqk, gcum, fq, fk,
            cu_seqlens, chunk_idx, scale, T, sq, sk, sv,
            HK=Hk, HV=Hv, DK=Dk, DV=Dv, BK=max(next_pow2(Dk), 16), BV=BV,
            USE_L2NORM=use_qk_l2norm, USE_GATE=gates is not None, IS_VARLEN=cu_seqlens is not None,
            IEEE=v.dtype == torch.float32, SPLIT=raw_operands(v.dtype, Dk, Dv), num_warps=num_warps,
        )

    # Large head dims in fp32 (Dk = 256) can outgrow shared memory: narrower value blocks (remembered
    # per configuration), then a one-line error instead of Triton's.
    BV = max(min(next_pow2(Dv), _BLOCK_V_THAT_FITS.get(key, block_v)), 16)
    BV = launch_fitting(launch, BV, 16, lambda bv: bv // 2, Dk, Dv, v.dtype)
    _BLOCK_V_THAT_FITS[key] = BV
    return w, u, Aqk, gcum, fq, fk


_BLOCK_V_THAT_FITS: dict = {}
