"""RMSNorm variants of the hybrid families.

* `ZeroCenteredRMSNorm`: Qwen3-Next / Qwen3.5 decoder, final, q_norm and k_norm. The stored weight
  w is centred on 0 and the scale applied is (1 + w); a checkpoint of zeros is the identity scale.
* `RMSNorm`: the same places in OLMo-Hybrid: plain scale w, centred on 1.
* `GatedRMSNorm`: the GDN output norm of every family, per value head: rmsnorm(x) * w * silu(z),
  w centred on 1.

Both compute in fp32 and return the input dtype. The gated norm stays in fp32 end to end, where
transformers rounds the normalised x to the model dtype before the weight: identical in fp32, one
rounding fewer in bf16/fp16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gdn_export.modules.dtypes import as_dtype


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class ZeroCenteredRMSNorm(nn.Module):
    """y = rmsnorm(x) * (1 + weight), over the last axis. x [..., D] -> y [..., D] in x's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _rms(as_dtype(x, torch.float32), self.eps) * (1.0 + as_dtype(self.weight, torch.float32))
        return as_dtype(y, x.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


class RMSNorm(nn.Module):
    """y = rmsnorm(x) * weight, over the last axis. x [..., D] -> y [..., D] in x's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _rms(as_dtype(x, torch.float32), self.eps) * as_dtype(self.weight, torch.float32)
        return as_dtype(y, x.dtype)

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
        f32 = torch.float32
        y = _rms(as_dtype(x, f32), self.eps) * as_dtype(self.weight, f32) * F.silu(as_dtype(z, f32))
        return as_dtype(y, x.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"
