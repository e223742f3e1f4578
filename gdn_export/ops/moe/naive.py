"""Golden fp32 reference of the routed experts: gather the tokens of each expert, scatter back.

Written for clarity, independently of the fast paths: routing with torch.softmax / torch.topk,
then one loop over the experts that were hit, each running its SwiGLU on its own tokens, the
weighted results index-added into the output (transformers' own order of operations).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def route(router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [N, E] -> (expert ids [N, k] int64, weights [N, k] fp32 (fp64 for fp64 logits)).

    Softmax in fp32 over experts, the k largest probabilities, renormalised to sum 1 if asked.
    """
    compute = torch.float64 if router_logits.dtype == torch.float64 else torch.float32
    probs = torch.softmax(router_logits.to(compute), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights


def moe(
    hidden: torch.Tensor,
    router_logits: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    norm_topk_prob: bool = True,
) -> torch.Tensor:
    """Routed experts in fp32 (fp64 for fp64 inputs).

    Args:
        hidden [N, H], router_logits [N, E], gate_up [E, 2I, H] (gate rows then up rows),
        down [E, H, I]; top_k in [1, E]; norm_topk_prob: renormalise the top-k weights.
    Returns:
        out [N, H] in hidden's dtype.
    """
    compute = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    x = hidden.to(compute)
    ids, weights = route(router_logits, top_k, norm_topk_prob)
    out = torch.zeros_like(x)
    I = down.shape[-1]
    for e in torch.unique(ids).tolist():
        token, slot = torch.where(ids == e)
        w_gu = gate_up[e].to(compute)
        h = F.linear(x[token], w_gu)  # [M, 2I]
        act = F.silu(h[:, :I]) * h[:, I:]
        y = F.linear(act, down[e].to(compute))  # [M, H]
        out.index_add_(0, token, y * weights[token, slot, None].to(compute))
    return out.to(hidden.dtype)
