"""Chunked gated delta rule forward (prefill): the sequential half plus the public wrapper.

The chunk-local work (cumsum, (I + A)^-1, w, u, causal q.k) runs first in wy.py, for all chunks
at once. This kernel then walks the chunks of one sequence in order, one program per
(value block, sequence x value head), with the fp32 state block in registers, held transposed as
hT [BV, Dk] (h = hT^T); a 16-bit stored state is read once and rounded once, at the final store:

    v_new = u - w h                                   (this chunk's corrected values)
    o     = fq * (q h) + Aqk v_new                    (written directly: no per-chunk h in memory)
    hT    = exp(G_last) hT + (fk * v_new)^T k

(fq = scale exp(G) / ||q||, fk = exp(G_last - G) / ||k||, row factors from wy.py), so the states
between chunks never leave the SM and the only traffic is q, k, w, u, Aqk in and o out.
Products: exact fp32 (ieee) for fp32 inputs. For 16-bit inputs with head dims that are multiples
of 64 (utils.raw_operands; other dims use fp32 copies on TF32) q, k and w enter the tensor cores
as they are stored (no fp32 copies: fewer live registers); w h and q h read the state rounded to
the input dtype (~4e-4 on o), Aqk v_new is TF32, and the update takes fk * v_new as two 16-bit
halves (wy.dot_split), because rounding v_new there cost ~6e-3 of the final state (interpreter).
The state is transposed so that the update reads k in its stored layout: with h [Dk, BV] the
update needs k^T, and a transposed 16-bit tile as the left operand gave NaN or illegal addresses
on the H200 with Triton 3.6. KV_STATE (launcher: kv_state=True) holds h [Dk, BV] and loads k^T
straight from memory instead of transposing a tile: compiled for sm_90 (Triton 3.6, bf16, Dk = 128,
BV = 32) all five products are wgmma, where hT's two update products (M = BV = 32) are mma.sync.
It is a variant of the launch sweep (benchmarks/bench_kernels.py) until a GPU has timed it; the
interpreter tests check it against the oracle.

The fused form (chunk_gated_delta_rule(form="fused"), chunk_fused_fwd_kernel) moves w, u and Aqk
out of memory: wy.py writes only X = (I + A)^-1 diag(beta) [64 x 64 fp32 a chunk] and three row
factors, and the sequential kernel forms v_new = X (v - diag(exp(G) / ||k||) k h) and Aqk from the
q, k, v tiles it reads anyway. Per chunk and value block of 32 (Dk = Dv = 128, bf16) it reads 52 KB
instead of 76 (q, k, v, X against q, k, w, u, Aqk), and wy.py writes 256 bytes a token and head
instead of 1 KB; in exchange q k^T and X t run inside the sequential loop. FORM picks the default.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_utils import (as_kernel_input, cdiv, chunk_indices, gdn_outputs, launch_fitting, next_pow2,
                                  prepare_inputs, raw_operands, state_dtype, to_state_dtype, token_strides)
from kernels.gated_delta_rule.triton.wy import chunk_inverse_fwd, chunk_wy_fwd, dot_split, dot_split_right
from kernels.triton_utils import dot


@triton.jit
def _sequence(i_nh, cu_seqlens, T, HK, HV, IS_VARLEN: tl.constexpr):
    # Program i_nh's value head, key head, batch row, first token and length of the sequence it walks.
    i_n, i_h = i_nh // HV, i_nh % HV
    i_hk = i_h // (HV // HK)
    if IS_VARLEN:
        i_b = 0
        bos, eos = tl.load(cu_seqlens + i_n), tl.load(cu_seqlens + i_n + 1)
    else:
        i_b = i_n
        bos, eos = i_n * T, i_n * T + T
    return i_h, i_hk, i_b, bos, eos - bos


# T and the head counts are left unspecialised: one compiled kernel serves every length and every
# Hk / Hv of a head size (they only index programs and rows).
@triton.jit(do_not_specialize=["T", "HK", "HV"])
def chunk_state_output_fwd_kernel(
    q, k, w, u, Aqk, gcum, fq, fk, h0, o, ht,
    cu_seqlens,
    T, sq, sk,
    HK, HV, DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    USE_INITIAL_STATE: tl.constexpr, IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr, SPLIT: tl.constexpr, NUM_STAGES: tl.constexpr, KV_STATE: tl.constexpr = False,
):
    # KV_STATE: the state held as h [Dk, BV] (its stored layout) instead of hT [BV, Dk], and k read
    # transposed from memory for the update, whose product is then M = Dk rows (wgmma on sm_90 at
    # BV = 32, where hT's M = BV = 32 takes mma.sync)
    # sq, sk: elements between consecutive tokens of q, k (utils.token_stride)
    BT: tl.constexpr = 64
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_h, i_hk, i_b, bos, Tn = _sequence(i_nh, cu_seqlens, T, HK, HV, IS_VARLEN)
    r0 = (i_b * HV + i_h) * T + bos - i_b * T   # first row of this sequence in the intermediates

    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < DK, o_v < DV
    # hT [BV, Dk]: the update then takes k in its stored layout (see the module docstring)
    if KV_STATE:
        m_vk = m_k[:, None] & m_v[None, :]
        p_hT = o_k[:, None] * DV + o_v[None, :]
    else:
        m_vk = m_v[:, None] & m_k[None, :]
        p_hT = o_v[:, None] + o_k[None, :] * DV
    if USE_INITIAL_STATE:
        b_hT = tl.load(h0 + i_nh * DK * DV + p_hT, mask=m_vk, other=0).to(tl.float32)
    elif KV_STATE:
        b_hT = tl.zeros([BK, BV], dtype=tl.float32)
    else:
        b_hT = tl.zeros([BV, BK], dtype=tl.float32)

    for i_t in tl.range(0, tl.cdiv(Tn, BT), num_stages=NUM_STAGES):
        o_r = i_t * BT + o_t
        m_r = o_r < Tn
        m_rk, m_rv = m_r[:, None] & m_k[None, :], m_r[:, None] & m_v[None, :]
        b_w = tl.load(w + (r0 + o_r[:, None]) * DK + o_k[None, :], mask=m_rk, other=0)
        b_u = tl.load(u + (r0 + o_r[:, None]) * DV + o_v[None, :], mask=m_rv, other=0)
        b_A = tl.load(Aqk + (r0 + o_r[:, None]) * BT + o_t[None, :], mask=m_r[:, None], other=0)
        b_fq = tl.load(fq + r0 + o_r, mask=m_r, other=0)
        b_fk = tl.load(fk + r0 + o_r, mask=m_r, other=0)
        b_Gl = tl.load(gcum + r0 + tl.minimum(i_t * BT + BT, Tn) - 1)
        # 64-bit chunk bases (strided q / k of a long sequence pass 2**31 elements), 32-bit tiles
        t64 = (bos + i_t * BT).to(tl.int64)
        b_q = tl.load(q + t64 * sq + i_hk * DK + o_t[:, None] * sq + o_k[None, :], mask=m_rk, other=0)
        if KV_STATE:
            b_k = tl.load(k + t64 * sk + i_hk * DK + o_k[:, None] + o_t[None, :] * sk,
                          mask=m_k[:, None] & m_r[None, :], other=0)  # k^T [Dk, BT]
        else:
            b_k = tl.load(k + t64 * sk + i_hk * DK + o_t[:, None] * sk + o_k[None, :], mask=m_rk, other=0)

        if SPLIT:
            # w h and q h read the state rounded to the input dtype (costs ~4e-4 on o)
            b_hd = b_hT.to(q.dtype.element_ty)
        else:
            b_w, b_q, b_k = b_w.to(tl.float32), b_q.to(tl.float32), b_k.to(tl.float32)
            b_hd = b_hT
        if not KV_STATE:
            b_hd = tl.trans(b_hd)
        b_vn = b_u - dot(b_w, b_hd, IEEE)
        b_o = dot(b_q, b_hd, IEEE) * b_fq[:, None] + dot(b_A, b_vn, IEEE)
        tl.store(o + ((bos + o_r[:, None]) * HV + i_h) * DV + o_v[None, :],
                 b_o.to(o.dtype.element_ty), mask=m_rv)
        # the update keeps v_new's precision (rounding it to bf16 cost ~6e-3 of the final state)
        if KV_STATE:
            b_hT = b_hT * tl.exp(b_Gl) + dot_split_right(b_k, b_vn * b_fk[:, None], IEEE, SPLIT)
        else:
            b_hT = b_hT * tl.exp(b_Gl) + dot_split(tl.trans(b_vn * b_fk[:, None]), b_k, IEEE, SPLIT)

    # the one rounding of a 16-bit state per call (the op's rounding rule)
    tl.store(ht + i_nh * DK * DV + p_hT, to_state_dtype(b_hT, ht.dtype.element_ty), mask=m_vk)


# T and the head counts are left unspecialised, as in chunk_state_output_fwd_kernel.
@triton.jit(do_not_specialize=["T", "HK", "HV"])
def chunk_fused_fwd_kernel(
    q, k, v, X, gcum, rq, rk, h0, o, ht,
    cu_seqlens,
    T, sq, sk, sv,
    HK, HV, DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    USE_INITIAL_STATE: tl.constexpr, IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr, SPLIT: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    # The fused form: per chunk, from q, k, v and X = (I + A)^-1 diag(beta) (wy.chunk_inverse_fwd),
    #     t     = v - diag(exp(G) rk) k h
    #     v_new = X t                                   (= u - w h of the two-pass form)
    #     Aqk   = causal(diag(rq) q k^T diag(rk) exp(G_i - G_j))
    #     o     = diag(rq exp(G)) q h + Aqk v_new
    #     hT    = exp(G_last) hT + (fk v_new)^T k,      fk = rk exp(G_last - G)
    # (rq = scale / ||q||, rk = 1 / ||k|| from wy.py), so the only traffic is q, k, v, X and the row
    # factors in and o out (no w, u, Aqk in memory).
    # sq, sk, sv: elements between consecutive tokens of q, k, v (utils.token_stride)
    BT: tl.constexpr = 64
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_h, i_hk, i_b, bos, Tn = _sequence(i_nh, cu_seqlens, T, HK, HV, IS_VARLEN)
    r0 = (i_b * HV + i_h) * T + bos - i_b * T   # first row of this sequence in X, gcum, rq, rk

    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < DK, o_v < DV
    m_causal = o_t[:, None] >= o_t[None, :]
    m_vk = m_v[:, None] & m_k[None, :]
    p_hT = o_v[:, None] + o_k[None, :] * DV
    if USE_INITIAL_STATE:
        b_hT = tl.load(h0 + i_nh * DK * DV + p_hT, mask=m_vk, other=0).to(tl.float32)
    else:
        b_hT = tl.zeros([BV, BK], dtype=tl.float32)
    for i_t in tl.range(0, tl.cdiv(Tn, BT), num_stages=NUM_STAGES):
        o_r = i_t * BT + o_t
        m_r = o_r < Tn
        m_rk, m_rv = m_r[:, None] & m_k[None, :], m_r[:, None] & m_v[None, :]
        b_X = tl.load(X + (r0 + o_r[:, None]) * BT + o_t[None, :], mask=m_r[:, None], other=0)
        b_G = tl.load(gcum + r0 + o_r, mask=m_r, other=0)
        b_rq = tl.load(rq + r0 + o_r, mask=m_r, other=0)
        b_rk = tl.load(rk + r0 + o_r, mask=m_r, other=0)
        b_Gl = tl.load(gcum + r0 + tl.minimum(i_t * BT + BT, Tn) - 1)
        # 64-bit chunk bases (strided q / k / v of a long sequence pass 2**31 elements), 32-bit tiles
        t64 = (bos + i_t * BT).to(tl.int64)
        b_q = tl.load(q + t64 * sq + i_hk * DK + o_t[:, None] * sq + o_k[None, :], mask=m_rk, other=0)
        b_k = tl.load(k + t64 * sk + i_hk * DK + o_t[:, None] * sk + o_k[None, :], mask=m_rk, other=0)
        b_v = tl.load(v + t64 * sv + i_h * DV + o_t[:, None] * sv + o_v[None, :], mask=m_rv, other=0)
        if SPLIT:
            # k h and q h read the state rounded to the input dtype (as the two-pass form's w h)
            b_hd = b_hT.to(v.dtype.element_ty)
        else:
            b_q, b_k = b_q.to(tl.float32), b_k.to(tl.float32)
            b_hd = b_hT
        b_hd = tl.trans(b_hd)
        b_eG = tl.exp(b_G)
        b_t = b_v.to(tl.float32) - dot(b_k, b_hd, IEEE) * (b_eG * b_rk)[:, None]
        # TF32 for 16-bit inputs (X and t rounded to 10 mantissa bits; the hi + lo halves of both, three
        # products, spilled 350 bytes at 4 warps in the sm_90 compile)
        b_vn = dot(b_X, b_t, IEEE)
        # above the diagonal exp(G_i - G_j) may overflow to inf: where() drops it (no NaN leaks)
        b_A = tl.where(m_causal, dot(b_q, tl.trans(b_k), IEEE) * tl.exp(b_G[:, None] - b_G[None, :]) * b_rk[None, :],
                       0.0) * b_rq[:, None]
        b_o = dot(b_q, b_hd, IEEE) * (b_rq * b_eG)[:, None] + dot(b_A, b_vn, IEEE)
        tl.store(o + ((bos + o_r[:, None]) * HV + i_h) * DV + o_v[None, :], b_o.to(o.dtype.element_ty), mask=m_rv)
        # the update keeps v_new's precision (two halves against the raw k, as the two-pass form)
        b_fk = tl.where(m_r, b_rk * tl.exp(b_Gl - b_G), 0.0)
        b_hT = b_hT * tl.exp(b_Gl) + dot_split(tl.trans(b_vn * b_fk[:, None]), b_k, IEEE, SPLIT)

    # the one rounding of a 16-bit state per call (the op's rounding rule)
    tl.store(ht + i_nh * DK * DV + p_hT, to_state_dtype(b_hT, ht.dtype.element_ty), mask=m_vk)


def _launch_parameters(block_v, num_warps, num_stages, Dk, Dv, dtype):
    """(BV, BK, split, num_warps, num_stages) of a sequential kernel's launch, overrides applied.
    Defaults, swept on the H200 for the two-pass kernel (bf16, Hv=32, 128 x 128): 32 value columns,
    4 warps, 3 stages is the fastest at B=1 T=16384 (0.46 ms; 0.69 at 2 stages, 0.87 at BV=64) and
    at B=8 T=8192 (1.83 ms; 1.92 at BV=64 4 warps 2 stages, 2.74 at BV=64 8 warps)."""
    BV = max(min(32 if block_v is None else block_v, next_pow2(Dv)), 16)
    return (BV, max(next_pow2(Dk), 16), raw_operands(dtype, Dk, Dv), 4 if num_warps is None else num_warps,
            3 if num_stages is None else num_stages)


def chunk_fused_fwd(q, k, v, X, gcum, rq, rk, initial_state, cu_seqlens=None, out=None,
                    final_state=None, block_v=None, num_warps=None, num_stages=None):
    """Launch the fused sequential kernel on wy.chunk_inverse_fwd's outputs.

    Args:
        q, k [B, T, Hk, Dk], v [B, T, Hv, Dv] in one dtype (contiguous, or with a token stride:
            utils.token_stride). X [B, Hv, T, 64], gcum / rq / rk [B, Hv, T]: wy.chunk_inverse_fwd's outputs.
        initial_state: [N, Hv, Dk, Dv] contiguous fp32, fp16 or bf16, or None. cu_seqlens: [N + 1] or None.
        block_v, num_warps, num_stages: launch overrides (defaults: BV 32, 4 warps, 3 stages).
    Returns:
        o [B, T, Hv, Dv] in v's dtype and final_state [N, Hv, Dk, Dv] in initial_state's dtype (fp32 for
        None; a given final_state may have any of the three), rounded once at the end.
    """
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[2], v.shape[3]
    sq, sk, sv = token_strides(q, k, v)
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    o, ht = gdn_outputs(v, B, T, Hv, Dk, Dv, N, initial_state, out, final_state)
    BV, BK, split, num_warps, num_stages = _launch_parameters(block_v, num_warps, num_stages, Dk, Dv, v.dtype)
    key = ("fused", BK, BV, v.dtype, split, num_warps, num_stages)

    def launch(stages):
        chunk_fused_fwd_kernel[(cdiv(Dv, BV), N * Hv)](
            q, k, v, X, gcum, rq, rk, initial_state, o, ht, cu_seqlens, T, sq, sk, sv,
            HK=Hk, HV=Hv, DK=Dk, DV=Dv, BK=BK, BV=BV,
            USE_INITIAL_STATE=initial_state is not None,
            IS_VARLEN=cu_seqlens is not None, IEEE=v.dtype == torch.float32, SPLIT=split,
            NUM_STAGES=stages, num_warps=num_warps,
        )

    stages = launch_fitting(launch, _STAGES_THAT_FIT.get(key, num_stages), 1, lambda s: s - 1, Dk, Dv, v.dtype)
    _STAGES_THAT_FIT[key] = stages
    return o, ht


def chunk_state_output_fwd(q, k, w, u, Aqk, gcum, fq, fk, initial_state, cu_seqlens=None, out=None,
                           final_state=None, block_v=None, num_warps=None, num_stages=None, kv_state=False):
    """Launch the sequential kernel on wy.py's outputs.

    Args:
        q, k: [B, T, Hk, Dk] in the input dtype (contiguous, or with a token stride:
            utils.token_stride). w [B, Hv, T, Dk], u [B, Hv, T, Dv], Aqk
            [B, Hv, T, 64], gcum / fq / fk [B, Hv, T]: wy.chunk_wy_fwd's outputs.
        initial_state: [N, Hv, Dk, Dv] contiguous fp32, fp16 or bf16, or None. cu_seqlens: [N + 1]
            int32 or None.
        block_v, num_warps, num_stages: launch overrides (defaults: the run-5 sweep's best).
        kv_state: hold the state as h [Dk, BV] (the kernel's KV_STATE; not the default: a variant for
            the sweep, benchmarks/bench_kernels.py, until a GPU has timed it).
    Returns:
        o [B, T, Hv, Dv] in q's dtype and final_state [N, Hv, Dk, Dv] in initial_state's dtype
        (fp32 for None; a given final_state may have any of the three), rounded once at the end.
    """
    B, T, Hk, Dk = k.shape
    Hv, Dv = u.shape[1], u.shape[3]
    sq, sk = token_strides(q, k)
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    o, ht = gdn_outputs(q, B, T, Hv, Dk, Dv, N, initial_state, out, final_state)
    BV, BK, split, num_warps, num_stages = _launch_parameters(block_v, num_warps, num_stages, Dk, Dv, q.dtype)
    key = (BK, BV, q.dtype, split, num_warps, num_stages, bool(kv_state))

    def launch(stages):
        chunk_state_output_fwd_kernel[(cdiv(Dv, BV), N * Hv)](
            q, k, w, u, Aqk, gcum, fq, fk, initial_state, o, ht, cu_seqlens, T, sq, sk,
            HK=Hk, HV=Hv, DK=Dk, DV=Dv, BK=BK, BV=BV,
            USE_INITIAL_STATE=initial_state is not None,
            IS_VARLEN=cu_seqlens is not None, IEEE=q.dtype == torch.float32, SPLIT=split,
            NUM_STAGES=stages, KV_STATE=bool(kv_state), num_warps=num_warps,
        )

    # Prefetching six tiles per stage can outgrow shared memory (large Dk, fp32): fewer stages
    # rather than a failure; remembered per configuration.
    stages = launch_fitting(launch, _STAGES_THAT_FIT.get(key, num_stages), 1, lambda s: s - 1, Dk, Dv, q.dtype)
    _STAGES_THAT_FIT[key] = stages
    return o, ht


_STAGES_THAT_FIT: dict = {}

FORMS = ("two-pass", "fused")
FORM = "two-pass"


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
    form: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked (WY) gated delta rule forward.

    Args:
        q, k: [B, T, Hk, Dk]. v: [B, T, Hv, Dv], Hv a multiple of Hk (key head h // (Hv // Hk)).
        g: [B, T, Hv] log decay (read as fp32). beta: [B, T, Hv].
        initial_state: [N, Hv, Dk, Dv] fp32, fp16 or bf16 (the state's storage dtype; float64
            reads as fp32) or None (zeros, fp32 storage).
        scale: multiplies q (default Dk ** -0.5). use_qk_l2norm: L2-normalise q, k in the kernels.
        cu_seqlens: [N + 1] token offsets of packed sequences (B must be 1), or None.
        gates: (a, b, A_log, dt_bias) instead of g / beta (pass g = beta = None): a, b [B, T, Hv],
            A_log, dt_bias [Hv]; g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b).
        out, final_state: optional preallocated o / final_state to write into.
        form: "two-pass" (wy.chunk_wy_fwd writes w, u, Aqk; chunk_state_output_fwd reads them) or
            "fused" (wy.chunk_inverse_fwd writes (I + A)^-1 only; chunk_fused_fwd forms the rest per
            chunk); default FORM.
    Returns:
        o [B, T, Hv, Dv] in v's dtype (fp32 compute for float64), final_state [N, Hv, Dk, Dv] in
        the state's storage dtype, held in fp32 across all chunks and rounded once when stored.
    """
    form = FORM if form is None else form
    if form not in FORMS:
        raise ValueError(f"chunk_gated_delta_rule: form must be one of {', '.join(FORMS)}, got {form!r}")
    q, k, v, g, beta, gates, scale, cu, offsets = prepare_inputs(q, k, v, g, beta, gates, scale, cu_seqlens)
    h0 = None if initial_state is None else as_kernel_input(initial_state, state_dtype(initial_state))
    idx = None if cu is None else chunk_indices(cu, q.shape[1], offsets)
    if form == "fused":
        inv = chunk_inverse_fwd(q, k, v, g, beta, scale, use_qk_l2norm, cu, idx, gates=gates)
        return chunk_fused_fwd(q, k, v, *inv, h0, cu, out=out, final_state=final_state)
    w, u, Aqk, gcum, fq, fk = chunk_wy_fwd(q, k, v, g, beta, scale, use_qk_l2norm, cu, idx, gates=gates)
    return chunk_state_output_fwd(q, k, w, u, Aqk, gcum, fq, fk, h0, cu, out=out, final_state=final_state)
