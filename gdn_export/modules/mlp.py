"""Feed-forward blocks: the dense SwiGLU MLP and Qwen3-Next's sparse MoE block.

The MoE block is written in a dense-equivalent form so that it exports to standard ONNX without
data-dependent control flow: every expert runs on every token, and the expert outputs are combined
with a [tokens, experts] routing matrix that is zero outside each token's top-k. The result equals
transformers' gather/scatter implementation (the unselected experts are multiplied by exactly 0);
the cost is num_experts / top_k times the routed compute, which is the price of a static graph.
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


class SparseMoeBlock(nn.Module):
    """Top-k routed experts plus a sigmoid-gated shared expert (Qwen3-Next).

    x [B, T, hidden] -> [B, T, hidden]. Parameters: gate.weight [E, hidden] (router),
    experts.{e}.{gate,up,down}_proj, shared_expert.*, shared_expert_gate.weight [1, hidden].
    """

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.gate = nn.Linear(hidden, config.num_experts, bias=False)
        self.experts = nn.ModuleList(
            SwiGLUMLP(hidden, config.moe_intermediate_size) for _ in range(config.num_experts)
        )
        self.shared_expert = SwiGLUMLP(hidden, config.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [N, hidden]
        weights = routing_weights(self.gate(x), self.top_k, self.norm_topk_prob)  # [N, E]
        # All experts as two wide matmuls: gate/up rows of expert e at [e*I, (e+1)*I), and the
        # down projections side by side, so that the graph is MatMuls TensorRT handles natively.
        E = len(self.experts)
        w_gate = torch.cat([e.gate_proj.weight for e in self.experts])  # [E*I, hidden]
        w_up = torch.cat([e.up_proj.weight for e in self.experts])  # [E*I, hidden]
        w_down = torch.cat([e.down_proj.weight for e in self.experts], dim=1)  # [hidden, E*I]
        h = F.silu(F.linear(x, w_gate)) * F.linear(x, w_up)  # [N, E*I]
        # Weight before the down projection: one [N, hidden] result, no [N, E, hidden] tensor.
        h = (h.view(x.shape[0], E, -1) * weights[..., None]).view(x.shape[0], -1)
        routed = F.linear(h, w_down)
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return (routed + shared).reshape(shape)
