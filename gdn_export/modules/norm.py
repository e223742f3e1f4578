"""RMSNorm variants of the hybrid families (the op: gdn_export.ops.rms_norm).

* `ZeroCenteredRMSNorm`: Qwen3-Next / Qwen3.5 decoder, final, q_norm and k_norm. The stored weight
  w is centred on 0 and the scale applied is (1 + w); a checkpoint of zeros is the identity scale.
* `RMSNorm`: the same places in OLMo-Hybrid: plain scale w, centred on 1.
* `GatedRMSNorm`: the GDN output norm of every family, per value head: rmsnorm(x) * w * silu(z),
  w centred on 1.

All compute in fp32 and return the input dtype. The gated norm stays in fp32 end to end, where
transformers rounds the normalised x to the model dtype before the weight: identical in fp32, one
rounding fewer in bf16/fp16. In eager mode on a GPU with a fast backend each norm is one fused
kernel, and `add` (the decoder's residual add and the norm after it) one kernel too; the exported
graph and torch.compile see the PyTorch form.
"""

from __future__ import annotations

import torch
from torch import nn

from gdn_export.ops.rms_norm import add_rms_norm, rms_norm


class ZeroCenteredRMSNorm(nn.Module):
    """y = rmsnorm(x) * (1 + weight), over the last axis. x [..., D] -> y [..., D] in x's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, zero_centered=True)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(s, y): s = x + residual, y = self(s); x, residual [..., D] of one dtype (one kernel on a GPU)."""
        return add_rms_norm(x, residual, self.weight, self.eps, zero_centered=True)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


class RMSNorm(nn.Module):
    """y = rmsnorm(x) * weight, over the last axis. x [..., D] -> y [..., D] in x's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(s, y): s = x + residual, y = self(s); x, residual [..., D] of one dtype (one kernel on a GPU)."""
        return add_rms_norm(x, residual, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


def make_rmsnorm(dim: int, eps: float, zero_centered: bool) -> nn.Module:
    """The decoder/final/q/k RMSNorm of a family (HybridConfig.zero_centered_norm)."""
    return (ZeroCenteredRMSNorm if zero_centered else RMSNorm)(dim, eps=eps)


class GatedRMSNorm(nn.Module):
    """y = rmsnorm(x) * weight * silu(z), over the last axis.

    x, z [..., D] -> y [..., D] in x's dtype. weight [D] starts at ones.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, gate=z)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"
