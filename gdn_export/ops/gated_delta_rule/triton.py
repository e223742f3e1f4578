"""The gated delta rule through the Triton kernels (kernels/gated_delta_rule/triton/), gathered as the
`triton` backend by gdn_export.ops.triton_backend (see gdn_export.ops.backends for the contract).

Decode and short prompts (every sequence at most RECURRENT_MAX_T tokens) run the fused recurrent
kernel; longer ones the chunked WY kernels. Outputs are fresh tensors (custom ops may not alias
their inputs), o in v's dtype and the state in initial_state's storage dtype (fp32 for None).
"""

from __future__ import annotations

from gdn_export.errors import GdnExportError
from kernels.gated_delta_rule.triton.chunk import chunk_gated_delta_rule
from kernels.gated_delta_rule.triton.fused_recurrent import (fused_recurrent_gated_delta_rule,
                                                             fused_recurrent_gated_delta_rule_steps)
from kernels.gated_delta_rule.triton.gates import RECURRENT_MAX_T


def _short(v, cu_seqlens) -> bool:
    """Whether every sequence has at most RECURRENT_MAX_T tokens. A pack is read on the host (a
    synchronisation, which stalls the GPU behind the host's launches) only when its length alone
    cannot tell: a total within the bound, or a mean over it, decides without reading lengths."""
    total = v.shape[1]
    if cu_seqlens is None or total <= RECURRENT_MAX_T:
        return total <= RECURRENT_MAX_T
    if total > RECURRENT_MAX_T * (cu_seqlens.numel() - 1):
        return False  # the longest sequence is at least the mean
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) <= RECURRENT_MAX_T


def gated_delta_rule(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens):
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g, beta [B, T, Hv]; initial_state [N, Hv, Dk, Dv] or None
    -> (o [B, T, Hv, Dv] in v's dtype, final_state [N, Hv, Dk, Dv])."""
    fn = fused_recurrent_gated_delta_rule if _short(v, cu_seqlens) else chunk_gated_delta_rule
    try:
        o, state = fn(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens)
    except ValueError as exc:  # a shape this GPU cannot run (said in one line by the launcher)
        raise GdnExportError(f"triton backend: {exc}") from None
    return o.to(v.dtype), state


def gated_delta_rule_inplace(q, k, v, g, beta, state, scale, use_qk_l2norm):
    """The final state written over `state` [B, Hv, Dk, Dv] (contiguous, its storage dtype) in place;
    returns o [B, T, Hv, Dv]."""
    if v.shape[1] <= RECURRENT_MAX_T:
        o, _ = fused_recurrent_gated_delta_rule(q, k, v, g, beta, state, scale, use_qk_l2norm,
                                                inplace=True)
    else:
        o, final = chunk_gated_delta_rule(q, k, v, g, beta, state, scale, use_qk_l2norm, None)
        state.copy_(final)
    return o.to(v.dtype)


def gated_delta_rule_steps(q, k, v, g, beta, initial_state, scale, use_qk_l2norm):
    """o [B, T, Hv, Dv] and every token's state [B, T, Hv, Dk, Dv] from one launch of the fused
    recurrent kernel (gdn_export.ops.gated_delta_rule.steps)."""
    try:
        return fused_recurrent_gated_delta_rule_steps(q, k, v, g, beta, initial_state, scale, use_qk_l2norm)
    except ValueError as exc:
        raise GdnExportError(f"triton backend: {exc}") from None
