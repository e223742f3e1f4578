"""Feed-forward blocks: the dense SwiGLU MLP and the sparse MoE block of Qwen3-Next / Qwen3.5-MoE.

The routed experts are held stacked, as transformers 5 holds them (`MoeExperts`), and run through
the sparse `gdn::moe` op (gdn_export.ops.moe): only each token's top-k experts compute, and at decode
only the routed experts' weights are read. It exports as one `gdn.MoE` node (TensorRT's MoE plugin;
ONNX Runtime runs a sparse function body); the shared expert and its gate stay standard ONNX.
"""

from __future__ import annotations

import torch
from torch import nn

from gdn_export.config import HybridConfig
from gdn_export.modules.fused_linear import project_together
from gdn_export.ops.moe import sparse_moe_forward
from gdn_export.modules.quant_linear import Fp8Linear
from gdn_export.ops.quant_linear import silu_mul_fp8_linear_fused, silu_mul_fp8_ready
from gdn_export.ops.silu_mul import silu_mul


class SwiGLUMLP(nn.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x)). x [..., hidden] -> [..., hidden]."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def fusible_linears(self) -> list[tuple[nn.Linear, ...]]:
        """gate / up: one GEMM after fuse_linears (runtime only)."""
        return [(self.gate_proj, self.up_proj)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = project_together(x, self.gate_proj, self.up_proj)
        down = self.down_proj
        if isinstance(down, Fp8Linear) and silu_mul_fp8_ready(gate, up, down.weight, down.bias):
            # eager GPU prefill: the FP8 down projection's x pass inside the silu * up kernel
            return silu_mul_fp8_linear_fused(gate, up, down.weight, down.weight_scale, down.input_scale, down.bias)
        return down(silu_mul(gate, up))


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
        return sparse_moe_forward(x, self)
