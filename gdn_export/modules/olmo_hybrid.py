"""OLMo-Hybrid's mixers, as subclasses that override only what differs from Qwen's.

Gated DeltaNet (`OlmoGatedDeltaNet`), Hk key heads of Dk, Hv value heads of Dv:

    q, k, v = q_proj(x), k_proj(x), v_proj(x)     one depthwise conv over q|k|v (state [C, K-1])
    z       = g_proj(x)  [Hv, Dv]                  the output gate
    b, a    = b_proj(x), a_proj(x)  [Hv]
    beta    = 2 sigmoid(b) in (0, 2) with linear_allow_neg_eigval (the default), else sigmoid(b)
    out     = o_proj(o_norm(o, z))                 gated RMSNorm with eps 1e-5 (transformers
                                                    hard-codes FLA's default there)

Attention (`OlmoAttention`): no output gate, q_norm / k_norm are plain RMSNorms over the whole
q / k projection (H*D and Hkv*D channels, before the split into heads), full rope on whole heads,
or no rope at all (NoPE: `use_rope` False, as the released checkpoints).
"""

from __future__ import annotations

import torch
from torch import nn

from gdn_export.config import HybridConfig
from gdn_export.modules.gated_attention import GatedAttention
from gdn_export.modules.fused_linear import project_together
from gdn_export.modules.gated_deltanet import GatedDeltaNet
from gdn_export.modules.norm import GatedRMSNorm, RMSNorm
from gdn_export.modules.rotary import apply_rotary


class OlmoGatedDeltaNet(GatedDeltaNet):
    """GatedDeltaNet with OLMo-Hybrid's separate projections (same forward and state contract)."""

    LAYOUTS = ("separate",)

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx, layout="separate")
        self.allow_neg_eigval = config.allow_neg_eigval
        self.beta_scale = 2.0 if config.allow_neg_eigval else 1.0

    def make_projections(self, config: HybridConfig) -> None:
        hidden, Hv = config.hidden_size, self.num_v_heads
        self.q_proj = nn.Linear(hidden, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.value_dim, bias=False)
        self.a_proj = nn.Linear(hidden, Hv, bias=False)
        self.b_proj = nn.Linear(hidden, Hv, bias=False)
        self.g_proj = nn.Linear(hidden, self.value_dim, bias=False)

    def fusible_linears(self) -> list[tuple[nn.Linear, ...]]:
        return [(self.q_proj, self.k_proj, self.v_proj, self.g_proj, self.b_proj, self.a_proj)]

    def make_output(self, config: HybridConfig) -> None:
        self.o_norm = GatedRMSNorm(self.head_v_dim, eps=config.gdn_norm_eps)
        self.o_proj = nn.Linear(self.value_dim, config.hidden_size, bias=False)

    def project(self, x: torch.Tensor):
        B, T, _ = x.shape
        q, k, v, z, b, a = project_together(x, self.q_proj, self.k_proj, self.v_proj, self.g_proj,
                                            self.b_proj, self.a_proj)
        mixed = torch.cat((q, k, v), dim=-1)
        return mixed, z.reshape(B, T, self.num_v_heads, self.head_v_dim), b, a

    def output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.o_norm.project(o, z, self.o_proj)


class OlmoAttention(GatedAttention):
    """GatedAttention with OLMo-Hybrid's projections (same forward and cache contract)."""

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        if config.attn_output_gate:
            raise ValueError("OlmoAttention has no output gate (attn_output_gate must be False)")
        super().__init__(config, layer_idx)
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        self.use_rope = config.use_rope
        # Over the whole projection, not per head: replaces the per-head norms of the base class.
        self.q_norm = RMSNorm(H * D, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(Hkv * D, eps=config.rms_norm_eps)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        B, T, _ = x.shape
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = project_together(x, self.q_proj, self.k_proj, self.v_proj)
        q = self.q_norm(q).reshape(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
        k = self.k_norm(k).reshape(B, T, Hkv, D).transpose(1, 2)  # [B, Hkv, T, D]
        v = v.reshape(B, T, Hkv, D).transpose(1, 2)
        if self.use_rope:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return q, k, v, None
