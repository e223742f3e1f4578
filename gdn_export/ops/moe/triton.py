"""The routed experts through the Triton kernels (kernels/moe/triton/), gathered as the `triton`
backend by gdn_export.ops.triton_backend (see gdn_export.ops.backends for the contract)."""

from __future__ import annotations

from kernels.moe.triton.moe import moe as _moe


def moe(hidden, router_logits, gate_up, down, top_k, norm_topk_prob):
    """hidden [N, H]; router_logits [N, E]; gate_up [E, 2I, H]; down [E, H, I] -> out [N, H]."""
    return _moe(hidden, router_logits, gate_up, down, top_k, norm_topk_prob)
