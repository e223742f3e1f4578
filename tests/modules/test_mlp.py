"""Dense SwiGLU and the sparse MoE block (through the gdn::moe op) against a per-token routed loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gdn_export.hf_config import parse_config
from gdn_export.config import HybridConfig
from gdn_export.modules.mlp import SparseMoeBlock, SwiGLUMLP
from gdn_export.weights.tiny import tiny_config_dict


def test_swiglu_formula():
    m = SwiGLUMLP(8, 12)
    x = torch.randn(3, 8)
    ref = (F.silu(x @ m.gate_proj.weight.T) * (x @ m.up_proj.weight.T)) @ m.down_proj.weight.T
    torch.testing.assert_close(m(x), ref)


def _loop_reference(m: SparseMoeBlock, x):
    """What a router does: per token, softmax, top-k, run only the chosen experts."""
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        probs = torch.softmax(m.gate(x[n]), -1)
        values, index = probs.topk(m.top_k)
        if m.norm_topk_prob:
            values = values / values.sum()
        I = m.experts.intermediate_size
        for value, e in zip(values, index):
            gate, up = m.experts.gate_up_proj[e, :I], m.experts.gate_up_proj[e, I:]
            out[n] += value * (m.experts.down_proj[e] @ (F.silu(gate @ x[n]) * (up @ x[n])))
        out[n] += torch.sigmoid(m.shared_expert_gate(x[n])) * m.shared_expert(x[n])
    return out


@pytest.mark.parametrize("family, experts, top_k, norm", [
    ("qwen3_next", 4, 2, True), ("qwen3_next", 5, 1, False), ("qwen3_next", 8, 3, True),
    ("qwen3_5_moe", 6, 2, True),
], ids=["E4-k2-norm", "E5-k1-raw", "E8-k3-norm", "qwen3_5_moe-E6-k2"])
def test_moe_block_equals_routed_loop(family, experts, top_k, norm):
    torch.manual_seed(experts)
    extra = {} if family == "qwen3_5_moe" else {"norm_topk_prob": norm}
    config = parse_config(tiny_config_dict(
        family, num_experts=experts, num_experts_per_tok=top_k, **extra))
    m = SparseMoeBlock(config)
    assert tuple(m.experts.gate_up_proj.shape) == (experts, 64, 64)  # [E, 2I, hidden], I = 32
    assert tuple(m.experts.down_proj.shape) == (experts, 64, 32)
    with torch.no_grad():
        m.gate.weight.normal_(0, 0.5)
        m.experts.gate_up_proj.normal_(0, 0.1)
        m.experts.down_proj.normal_(0, 0.1)
    x = torch.randn(2, 11, 64)
    out = m(x)
    assert out.shape == x.shape
    torch.testing.assert_close(out.reshape(-1, 64), _loop_reference(m, x.reshape(-1, 64)), atol=1e-6, rtol=1e-5)
