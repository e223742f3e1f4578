"""silu(gate) * up in PyTorch (the graph's form: what the ONNX exporter traces and torch.compile fuses)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up [..., I] -> [..., I] in their dtype (gdn_export.ops.silu_mul)."""
    return F.silu(gate) * up
