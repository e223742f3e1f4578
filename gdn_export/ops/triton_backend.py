"""The `triton` backend of the gdn ops (see gdn_export.ops.backends for the contract).

Decode and short prompts (every sequence at most RECURRENT_MAX_T tokens) run the fused recurrent
kernel; longer ones the chunked WY kernels. Outputs are fresh tensors (custom ops may not alias
their inputs), o in v's dtype and the state in initial_state's storage dtype (fp32 for None).
"""

from __future__ import annotations

from gdn_export.errors import GdnExportError
from gdn_export.ops.causal_conv1d.triton import causal_conv1d as _conv
from gdn_export.ops.gated_delta_rule.triton.chunk import chunk_gated_delta_rule
from gdn_export.ops.gated_delta_rule.triton.fused_recurrent import fused_recurrent_gated_delta_rule
from gdn_export.ops.gated_delta_rule.triton.gates import RECURRENT_MAX_T
from gdn_export.ops.moe.triton import moe as _moe


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
    fn = fused_recurrent_gated_delta_rule if _short(v, cu_seqlens) else chunk_gated_delta_rule
    try:
        o, state = fn(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens)
    except ValueError as exc:  # a shape this GPU cannot run (said in one line by the launcher)
        raise GdnExportError(f"triton backend: {exc}") from None
    return o.to(v.dtype), state


def gated_delta_rule_inplace(q, k, v, g, beta, state, scale, use_qk_l2norm):
    """The final state written over `state` (contiguous, its storage dtype) in place; returns o."""
    if v.shape[1] <= RECURRENT_MAX_T:
        o, _ = fused_recurrent_gated_delta_rule(q, k, v, g, beta, state, scale, use_qk_l2norm,
                                                inplace=True)
    else:
        o, final = chunk_gated_delta_rule(q, k, v, g, beta, state, scale, use_qk_l2norm, None)
        state.copy_(final)
    return o.to(v.dtype)


def causal_conv1d(x, weight, bias, conv_state, silu, seq_lens=None):
    y, state = _conv(x, weight, bias, conv_state, silu, seq_lens=seq_lens)
    return y.to(x.dtype), state.to(x.dtype)


def moe(hidden, router_logits, gate_up, down, top_k, norm_topk_prob):
    return _moe(hidden, router_logits, gate_up, down, top_k, norm_topk_prob)
