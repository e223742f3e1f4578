"""Partial rotary position embedding with transformers' rotate_half convention.

Only the first `rotary_dim` channels of each head rotate; within them channel i pairs with
channel i + rotary_dim/2 (rotate_half), not with its neighbour. Frequencies are the default rope:
inv_freq[j] = 1 / theta^(2j / rotary_dim).

Qwen3.5's multimodal rope (mrope_section) reduces to this when the three position streams are
equal, as they are for text (see gdn_export.config).
"""

from __future__ import annotations

import torch
from torch import nn

from gdn_export.ops.dtypes import as_dtype
from gdn_export.ops import rotary as rotary_op


class RotaryEmbedding(nn.Module):
    """cos/sin tables for absolute positions.

    forward(position_ids [B, T] int64, dtype) -> (cos, sin), each [B, T, rotary_dim] in `dtype`.
    """

    def __init__(self, rotary_dim: int, theta: float) -> None:
        super().__init__()
        if rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
        self.rotary_dim = rotary_dim
        self.theta = float(theta)

    def inv_freq(self, device: torch.device | None = None) -> torch.Tensor:
        # Built on the fly (not a buffer) so that model.to(bf16) cannot round the frequencies.
        exponent = torch.arange(0, self.rotary_dim, 2, dtype=torch.float32, device=device) / self.rotary_dim
        return 1.0 / (self.theta**exponent)

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq(position_ids.device)  # [B, T, R/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return as_dtype(emb.cos(), dtype), as_dtype(emb.sin(), dtype)

    def extra_repr(self) -> str:
        return f"rotary_dim={self.rotary_dim}, theta={self.theta}"


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first R channels of every head (gdn_export.ops.rotary: one fused kernel in eager
    GPU runs).

    x [B, H, T, D]; cos, sin [B, T, R] with R <= D even. Returns [B, H, T, D] in x's dtype.
    """
    return rotary_op.apply_rotary(x, cos, sin)
