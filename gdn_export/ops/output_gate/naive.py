"""The gated attention's output gate in PyTorch (the graph's form: what the ONNX exporter traces)."""

from __future__ import annotations

import torch


def output_gate(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """o [B, H, T, D], gate [B, T, H, D] -> [B, T, H D] (gdn_export.ops.output_gate)."""
    B, H, T, D = o.shape
    return o.transpose(1, 2).reshape(B, T, H * D) * torch.sigmoid(gate.reshape(B, T, H * D))
