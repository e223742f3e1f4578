"""The RMSNorm reference in PyTorch: fp32 math, the input dtype out (the graph's form: what the
ONNX exporter traces and torch.compile fuses)."""

from __future__ import annotations

import torch
import torch.nn.functional as F



def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in `dtype`; x itself when it has it (no cast node in a trace)."""
    return x if x.dtype == dtype else x.to(dtype)


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2, -1) + eps), in x's dtype (fp32 here)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool = False,
             gate: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., D], weight [D], gate [..., D] or None -> y [..., D] in x's dtype (gdn_export.ops.rms_norm)."""
    f32 = torch.float32
    y = rms(_as(x, f32), eps)
    w = _as(weight, f32)
    y = y * ((1.0 + w) if zero_centered else w)
    if gate is not None:
        y = y * F.silu(_as(gate, f32))
    return _as(y, x.dtype)
