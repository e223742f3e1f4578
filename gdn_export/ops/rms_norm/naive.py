"""The RMSNorm reference in PyTorch: fp32 math, the input dtype out (the graph's form: what the
ONNX exporter traces and torch.compile fuses)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gdn_export.ops.dtypes import as_dtype


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2, -1) + eps), in x's dtype (fp32 here)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool = False,
             gate: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., D], weight [D], gate [..., D] or None -> y [..., D] in x's dtype (gdn_export.ops.rms_norm)."""
    f32 = torch.float32
    y = rms(as_dtype(x, f32), eps)
    w = as_dtype(weight, f32)
    y = y * ((1.0 + w) if zero_centered else w)
    if gate is not None:
        y = y * F.silu(as_dtype(gate, f32))
    return as_dtype(y, x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 zero_centered: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [..., D] -> (s = x + residual, rms_norm(s)) (gdn_export.ops.rms_norm)."""
    s = x + residual
    return s, rms_norm(s, weight, eps, zero_centered)
