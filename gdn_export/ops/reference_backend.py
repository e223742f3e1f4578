"""The `reference` backend: the fp32 golden implementations.

Prefill (T > 1) goes through the chunked WY form, decode through the recurrence, as the fast
backends do; the two forms are tested against each other.
"""

from __future__ import annotations

from gdn_export.ops.causal_conv1d.naive import causal_conv1d as _conv
from gdn_export.ops.gated_delta_rule.naive import (
    chunked_gated_delta_rule,
    recurrent_gated_delta_rule,
    recurrent_gated_delta_rule_steps,
)
from gdn_export.ops.moe.naive import moe as _moe


def gated_delta_rule(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens):
    fn = recurrent_gated_delta_rule if v.shape[1] == 1 else chunked_gated_delta_rule
    o, state = fn(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens)
    # custom ops may not return views of, or aliases to, their inputs
    return o.contiguous(), state.contiguous()


def gated_delta_rule_steps(q, k, v, g, beta, initial_state, scale, use_qk_l2norm):
    return recurrent_gated_delta_rule_steps(q, k, v, g, beta, initial_state, scale, use_qk_l2norm)


def causal_conv1d(x, weight, bias, conv_state, silu, seq_lens=None):
    return _conv(x, weight, bias, conv_state, silu, seq_lens)


def moe(hidden, router_logits, gate_up, down, top_k, norm_topk_prob):
    return _moe(hidden, router_logits, gate_up, down, top_k, norm_topk_prob)
