"""Fused recurrent gated delta rule: decode (T = 1) and short prompts, optionally in place.

One program per (value block, sequence x value head) keeps its state block h [Dk, BV] fp32 in
registers for all T steps, so the state is read once and written once: at T = 1 the kernel is a
pure stream over the state (64 KiB per head at 128 x 128), and the value axis is split so that
thousands of 8-16 KiB tiles are in flight. With inplace the final state is written over the
initial one: every program reads its own tile before it writes it, and tiles never overlap.

The state is stored in fp32, fp16 or bf16 (h0 / ht's dtype) and held in fp32: a 16-bit state is
rounded once, where it is stored at the end (half the bytes of an fp32 decode step).

With `all_states` [B, T, Hv, Dk, Dv] (the verify step of speculative decoding) the kernel also
stores the state after every token, rounded to the storage dtype, and carries on from the rounded
value: the numbers of T one-token calls, so a row that keeps its first t + 1 tokens holds exactly
the state that decoding them one by one gives.

Per step: h = exp(g) h; v' = beta (v - h^T k); h += k v'^T; o = scale h^T q, with h^T q taken
from the decayed state before the update (one pass over the state for both reductions).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_utils import (STATE_DTYPES, as_kernel_input, cdiv, gdn_outputs, next_pow2, pdl_enter,
                                  pdl_launch, prepare_inputs, state_dtype, to_state_dtype, token_strides)


# T is left unspecialised: one compiled kernel serves every length.
@triton.jit(do_not_specialize=["T"])
def fused_recurrent_fwd_kernel(
    q, k, v, g, beta, a, b, A_log, dt_bias, h0, o, ht, hs,
    cu_seqlens,
    scale, T, sq, sk, sv,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    USE_L2NORM: tl.constexpr, USE_GATE: tl.constexpr, USE_INITIAL_STATE: tl.constexpr,
    IS_VARLEN: tl.constexpr, STORE_STEPS: tl.constexpr, USE_PDL: tl.constexpr = False,
):
    # sq, sk, sv: elements between consecutive tokens of q, k, v (utils.token_stride)
    pdl_enter(USE_PDL)
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // HV, i_nh % HV
    i_hk = i_h // (HV // HK)
    if IS_VARLEN:
        bos, eos = tl.load(cu_seqlens + i_n), tl.load(cu_seqlens + i_n + 1)
    else:
        bos, eos = i_n * T, i_n * T + T

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < DK, o_v < DV
    p_h = i_nh * DK * DV + o_k[:, None] * DV + o_v[None, :]
    if USE_INITIAL_STATE:
        b_h = tl.load(h0 + p_h, mask=m_k[:, None] & m_v[None, :], other=0).to(tl.float32)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_GATE:
        b_A = -tl.exp(tl.load(A_log + i_h).to(tl.float32))
        b_dt = tl.load(dt_bias + i_h).to(tl.float32)

    # 64-bit token bases, advanced by the token strides (a large strided batch passes 2**31)
    p_q = q + bos.to(tl.int64) * sq + i_hk * DK + o_k
    p_k = k + bos.to(tl.int64) * sk + i_hk * DK + o_k
    p_v = v + bos.to(tl.int64) * sv + i_h * DV + o_v
    for t in range(bos, eos):
        b_q = tl.load(p_q, mask=m_k, other=0).to(tl.float32)
        b_k = tl.load(p_k, mask=m_k, other=0).to(tl.float32)
        b_v = tl.load(p_v, mask=m_v, other=0).to(tl.float32)
        p_q, p_k, p_v = p_q + sq, p_k + sk, p_v + sv
        if USE_GATE:
            b_x = tl.load(a + t * HV + i_h).to(tl.float32) + b_dt
            b_g = b_A * tl.where(b_x > 20.0, b_x, tl.log(1.0 + tl.exp(tl.minimum(b_x, 20.0))))
            b_beta = tl.sigmoid(tl.load(b + t * HV + i_h).to(tl.float32))
        else:
            b_g = tl.load(g + t * HV + i_h).to(tl.float32)
            b_beta = tl.load(beta + t * HV + i_h).to(tl.float32)
        if USE_L2NORM:
            b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, 0) + 1e-6)
            b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, 0) + 1e-6)
        b_h *= tl.exp(b_g)
        # Both reductions over Dk read the decayed state, so they run side by side instead of one
        # after the update: (h + k v'^T)^T q = h^T q + v' (k . q).
        b_kh = tl.sum(b_h * b_k[:, None], 0)
        b_qh = tl.sum(b_h * b_q[:, None], 0)
        b_v = b_beta * (b_v - b_kh)
        b_h += b_k[:, None] * b_v[None, :]
        b_o = (b_qh + b_v * tl.sum(b_k * b_q, 0)) * scale
        tl.store(o + (t * HV + i_h) * DV + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
        if STORE_STEPS:
            # this token's state in the storage dtype; the next token starts from what is stored
            b_s = to_state_dtype(b_h, hs.dtype.element_ty)
            p_s = hs + (t * HV + i_h).to(tl.int64) * (DK * DV) + o_k[:, None] * DV + o_v[None, :]
            tl.store(p_s, b_s, mask=m_k[:, None] & m_v[None, :])
            b_h = b_s.to(tl.float32)

    # the one rounding of a 16-bit state per call (the op's rounding rule)
    tl.store(ht + p_h, to_state_dtype(b_h, ht.dtype.element_ty), mask=m_k[:, None] & m_v[None, :])


def fused_recurrent_fwd(q, k, v, g, beta, h0, scale, use_qk_l2norm, cu_seqlens=None, gates=None,
                        out=None, final_state=None, block_v=None, num_warps=None, all_states=None):
    """Launch the recurrent kernel on prepared inputs (one dtype; contiguous, or with a token stride:
    utils.token_stride); h0 [N, Hv, Dk, Dv] contiguous in the state dtype (or None); a new
    final_state takes h0's dtype (fp32 for None); all_states [B, T, Hv, Dk, Dv] contiguous (no
    cu_seqlens) also receives every token's state."""
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[2], v.shape[3]
    sq, sk, sv = token_strides(q, k, v)
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    o, ht = gdn_outputs(v, B, T, Hv, Dk, Dv, N, h0, out, final_state)
    BK = max(next_pow2(Dk), 16)
    if block_v is None:
        # 32 fp32 columns = 128-byte rows: full cache lines, and 4 tiles per 128-wide head.
        # H200, Hv = 32, 128 x 128: within 1% of the best of BV 8..128 x 1..8 warps at B = 1, 64
        # and 256. For a 16-bit state 64 columns (the same bytes per program) measured 3-5%
        # slower than 32 at B = 64..512, so 32 stays.
        block_v = 32
    BV = max(min(block_v, next_pow2(Dv)), 8)
    if num_warps is None and (T == 1 or all_states is not None) and cu_seqlens is None:
        # Decode: 128 fp32 state elements per thread, one warp at Dk = 128, BV = 32. Swept on the
        # H200 (B = 8 / 64 / 256, benchmarks/investigations/triton_decode_sweep.py): one warp beat two, the
        # earlier choice, everywhere: fp32 state 70 / 86 / 93% of copy bandwidth (two: 65 / 83 /
        # 87%), bf16 state 51 / 56 / 56% (two: 38 / 47 / 49%); other widths and warps were slower.
        # Every token's state stored (all_states) takes the decode launch too: the same reductions,
        # so a verify step's numbers are those of decode steps.
        num_warps = max(1, BK * BV // 4096)
    elif num_warps is None:
        # several tokens: more threads share each step's reductions (not swept for T > 1)
        num_warps = 2 if BK * BV <= 4096 else 4
    a, b, A_log, dt_bias = gates if gates is not None else (g, beta, g, g)
    fused_recurrent_fwd_kernel[(cdiv(Dv, BV), N * Hv)](
        q, k, v, g if gates is None else a, beta if gates is None else b, a, b, A_log, dt_bias,
        h0, o, ht, ht if all_states is None else all_states, cu_seqlens, scale, T, sq, sk, sv,
        HK=Hk, HV=Hv, DK=Dk, DV=Dv, BK=BK, BV=BV,
        USE_L2NORM=use_qk_l2norm, USE_GATE=gates is not None, USE_INITIAL_STATE=h0 is not None,
        IS_VARLEN=cu_seqlens is not None, STORE_STEPS=all_states is not None, num_warps=num_warps,
        **pdl_launch(o),
    )
    return o, ht


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor | None,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    inplace: bool = False,
    gates: tuple | None = None,
    out: torch.Tensor | None = None,
    final_state: torch.Tensor | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step-by-step gated delta rule in one kernel (decode and short T).

    Args:
        q, k: [B, T, Hk, Dk]. v: [B, T, Hv, Dv], Hv a multiple of Hk. g: [B, T, Hv] log decay.
        beta: [B, T, Hv]. initial_state: [N, Hv, Dk, Dv] fp32, fp16 or bf16 (the state's storage
            dtype; float64 reads as fp32) or None (zeros, fp32 storage).
        scale: default Dk ** -0.5. use_qk_l2norm: L2-normalise q and k in the kernel.
        cu_seqlens: [N + 1] offsets of packed sequences (B = 1), or None.
        inplace: write the final state over initial_state (must be a contiguous fp32, fp16 or
            bf16 tensor); the returned final_state is then initial_state itself.
        gates: (a, b, A_log, dt_bias) instead of g / beta (see chunk.chunk_gated_delta_rule).
        out, final_state: optional preallocated outputs. block_v, num_warps: value columns and
            warps per program (default: the measured best, see fused_recurrent_fwd).
    Returns:
        o [B, T, Hv, Dv] in v's dtype (fp32 for float64 inputs), final_state [N, Hv, Dk, Dv] in
        the state's storage dtype (initial_state's), rounded once at the end.
    """
    q, k, v, g, beta, gates, scale, cu, _ = prepare_inputs(q, k, v, g, beta, gates, scale, cu_seqlens)
    if inplace:
        if initial_state is None or initial_state.dtype not in STATE_DTYPES or not initial_state.is_contiguous():
            got = None if initial_state is None else (initial_state.dtype, initial_state.is_contiguous())
            raise ValueError(f"inplace needs a contiguous fp32, fp16 or bf16 initial_state, got {got}")
        h0 = final_state = initial_state
    else:
        h0 = None if initial_state is None else as_kernel_input(initial_state, state_dtype(initial_state))
    return fused_recurrent_fwd(q, k, v, g, beta, h0, scale, use_qk_l2norm, cu, gates=gates,
                               out=out, final_state=final_state, block_v=block_v, num_warps=num_warps)


def fused_recurrent_gated_delta_rule_steps(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule with the state after every token, in one launch (the verify step of
    speculative decoding; see the module docstring for the rounding).

    Args: as fused_recurrent_gated_delta_rule, without cu_seqlens.
    Returns:
        o [B, T, Hv, Dv] in v's dtype (fp32 for float64 inputs), states [B, T, Hv, Dk, Dv] in the
        state's storage dtype (initial_state's; fp32 for None): states[:, t] after token t.
    """
    q, k, v, g, beta, _, scale, _, _ = prepare_inputs(q, k, v, g, beta, None, scale, None)
    B, T, _, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    h0 = None if initial_state is None else as_kernel_input(initial_state, state_dtype(initial_state))
    states = torch.empty(B, T, Hv, Dk, Dv, dtype=torch.float32 if h0 is None else h0.dtype, device=v.device)
    o, _ = fused_recurrent_fwd(q, k, v, g, beta, h0, scale, use_qk_l2norm, all_states=states)
    return o, states
