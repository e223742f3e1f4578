"""Gated full attention of Qwen3-Next / Qwen3.5 with an explicit K/V cache.

Per layer (H query heads, Hkv key/value heads, head size D, R rotary channels):

    q, gate = q_proj(x) split per head as [q_h | gate_h]      (q_proj: H*2D outputs)
    q = rope(q_norm(q)), k = rope(k_norm(k_proj(x))), v = v_proj(x)
    K, V = concat(past K, k), concat(past V, v) along time    (the new cache)
    o = softmax(q K^T / sqrt(D) + causal mask) V              (GQA: head h reads kv head h // (H/Hkv))
    out = o_proj(o * sigmoid(gate))

Attention is plain matmul + softmax with an explicit boolean mask so that it exports to standard
ONNX ops. The mask is causal with the past length P as offset: query i (absolute position P + i)
sees keys j <= P + i.
"""

from __future__ import annotations

import torch
from torch import nn

from gdn_export.config import HybridConfig
from gdn_export.modules.norm import ZeroCenteredRMSNorm
from gdn_export.modules.rotary import apply_rotary


def causal_mask(t: int, past: int | torch.SymInt, device: torch.device) -> torch.Tensor:
    """[T, P+T] bool, True where query i may read key j (j <= P + i)."""
    q_pos = torch.arange(t, device=device) + past
    k_pos = torch.arange(t + past, device=device)
    return k_pos[None, :] <= q_pos[:, None]


class GatedAttention(nn.Module):
    """Causal GQA attention with per-head output gate, q/k RMSNorm and partial rope.

    forward(x [B, T, hidden], cos, sin [B, T, R], past_key, past_value [B, Hkv, P, D])
        -> (out [B, T, hidden], key, value [B, Hkv, P+T, D]), all in x's dtype.
    """

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.gated = config.attn_output_gate
        self.scaling = self.head_dim**-0.5
        hidden, bias = config.hidden_size, config.attention_bias
        q_out = self.num_heads * self.head_dim * (2 if self.gated else 1)
        self.q_proj = nn.Linear(hidden, q_out, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = ZeroCenteredRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, T, hidden] -> q [B, H, T, D], k, v [B, Hkv, T, D] (normed, rotated) and the output
        gate [B, T, H*D] (None without `attn_output_gate`). Families override this alone."""
        B, T, _ = x.shape
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q, gate = self.q_proj(x), None
        if self.gated:
            # The checkpoint interleaves per head: [q_0 | gate_0 | q_1 | gate_1 | ...].
            q, gate = q.view(B, T, H, 2 * D).chunk(2, dim=-1)
            gate = gate.reshape(B, T, H * D)
        q = self.q_norm(q.reshape(B, T, H, D)).transpose(1, 2)  # [B, H, T, D]
        k = self.k_norm(self.k_proj(x).view(B, T, Hkv, D)).transpose(1, 2)  # [B, Hkv, T, D]
        v = self.v_proj(x).view(B, T, Hkv, D).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return q, k, v, gate

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past_key: torch.Tensor,
        past_value: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v, gate = self.project(x, cos, sin)

        key = torch.cat((past_key.to(k.dtype), k), dim=2)  # [B, Hkv, P+T, D]
        value = torch.cat((past_value.to(v.dtype), v), dim=2)
        past = past_key.shape[2]

        # GQA without materialising repeated K/V: query head h = kv * G + g reads kv head h // G.
        G = H // Hkv
        qg = q.reshape(B, Hkv, G, T, D)
        scores = torch.matmul(qg, key[:, :, None].transpose(-1, -2)) * self.scaling  # [B, Hkv, G, T, P+T]
        mask = causal_mask(T, past, x.device)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
        o = torch.matmul(probs, value[:, :, None])  # [B, Hkv, G, T, D]
        o = o.reshape(B, H, T, D).transpose(1, 2).reshape(B, T, H * D)
        if gate is not None:
            o = o * torch.sigmoid(gate)
        return self.o_proj(o), key, value
