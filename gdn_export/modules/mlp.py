"""Feed-forward blocks: the dense SwiGLU MLP and the sparse MoE block of Qwen3-Next / Qwen3.5-MoE.

The routed experts are held stacked, as transformers 5 holds them (`MoeExperts`); `SparseMoeBlock.routed`
is the one method that computes with them, so that a sparse kernel can replace it alone.

The MoE block is written in a dense-equivalent form so that it exports to standard ONNX without
data-dependent control flow: every expert runs on every token, and the expert outputs are combined
with a [tokens, experts] routing matrix that is zero outside each token's top-k. The result equals
transformers' gather/scatter implementation (the unselected experts are multiplied by exactly 0);
the cost is num_experts / top_k times the routed compute, and an [E, N, hidden] intermediate, which
is the price of a static graph without a MoE op.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gdn_export.config import HybridConfig


class SwiGLUMLP(nn.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x)). x [..., hidden] -> [..., hidden]."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def routing_weights(logits: torch.Tensor, top_k: int, norm_topk_prob: bool) -> torch.Tensor:
    """Dense routing matrix from router logits.

    logits [N, E] -> weights [N, E] in logits' dtype: softmax over experts (in fp32), keep the
    top-k probabilities (renormalised to sum 1 when norm_topk_prob), zeros elsewhere.
    """
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    top_value, top_index = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        top_value = top_value / top_value.sum(dim=-1, keepdim=True)
    dense = torch.zeros_like(probs).scatter(-1, top_index, top_value)
    return dense.to(logits.dtype)


class MoeExperts(nn.Module):
    """The routed experts of a MoE block, stacked as transformers 5 holds them.

    gate_up_proj [E, 2I, hidden]: expert e's gate rows [e, :I], then its up rows [e, I:];
    down_proj [E, hidden, I]. Expert e computes down_proj[e] @ (silu(gate x) * up x).
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.num_experts, self.intermediate_size = num_experts, intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def extra_repr(self) -> str:
        E, I2, H = self.gate_up_proj.shape
        return f"num_experts={E}, hidden={H}, intermediate={I2 // 2}"


class SparseMoeBlock(nn.Module):
    """Top-k routed experts plus a sigmoid-gated shared expert (Qwen3-Next, Qwen3.5-MoE).

    x [B, T, hidden] -> [B, T, hidden]. Parameters: gate.weight [E, hidden] (router),
    experts.gate_up_proj [E, 2I, hidden], experts.down_proj [E, hidden, I] (`MoeExperts`),
    shared_expert.{gate,up,down}_proj, shared_expert_gate.weight [1, hidden].
    """

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.gate = nn.Linear(hidden, config.num_experts, bias=False)
        self.experts = MoeExperts(config.num_experts, hidden, config.moe_intermediate_size)
        self.shared_expert = SwiGLUMLP(hidden, config.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [N, hidden]
        routed = self.routed(x, self.gate(x))
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return (routed + shared).reshape(shape)

    def routed(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """Sum of the top-k experts' outputs weighted by their routing probabilities.

        x [N, hidden], router_logits [N, E] -> [N, hidden]. Dense-equivalent: every expert runs on
        every token and the routing matrix is zero outside each token's top-k (see module
        docstring); the stacked weights are used as they are, with no per-call copy of them.
        """
        weights = routing_weights(router_logits, self.top_k, self.norm_topk_prob)  # [N, E]
        I = self.experts.intermediate_size
        gate_up = torch.matmul(x, self.experts.gate_up_proj.transpose(1, 2))  # [E, N, 2I]
        h = F.silu(gate_up[..., :I]) * gate_up[..., I:]  # [E, N, I]
        h = h * weights.transpose(0, 1)[..., None]  # weight before the down projection
        return torch.matmul(h, self.experts.down_proj.transpose(1, 2)).sum(0)  # [N, hidden]
