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

Where the norm's output goes to an FP8 projection (per-tensor input scale) through cuBLASLt's FP8
GEMM (prefill rows on a GPU), `add_for` (the decoder's norms) and `GatedRMSNorm.project` (the GDN
output norm) have the same kernel write the output's FP8 form too (gdn_export.ops.rms_norm
.rms_norm_quantized), so the projection skips its own pass over the output (bit for bit the same
GEMM input).
"""

from __future__ import annotations

import torch
from torch import nn

from gdn_export.modules.quant_fusion import fp8_reader
from gdn_export.modules.quant_linear import Fp8Linear
from gdn_export.ops.quant_linear import fp8_linear_quantized, offer_quantized, prequantized_ready
from gdn_export.ops.rms_norm import add_rms_norm, quantized_ready, rms_norm, rms_norm_quantized


def _add_for(norm: nn.Module, zero_centered: bool, x: torch.Tensor, residual: torch.Tensor | None,
             reader: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """ZeroCenteredRMSNorm / RMSNorm `add_for`."""
    fp8 = fp8_reader(reader)
    if (fp8 is not None and prequantized_ready(x, fp8.weight, fp8.bias)
            and quantized_ready(x, norm.weight, residual)):
        s, y, yq, row_scale = rms_norm_quantized(x, norm.weight, norm.eps, fp8.input_scale, zero_centered,
                                                 residual=residual)
        offer_quantized(y, yq, row_scale, fp8.input_scale)
        return (x if s is None else s), y
    if residual is None:
        return x, norm(x)
    return norm.add(x, residual)


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

    def add_for(self, x: torch.Tensor, residual: torch.Tensor | None, reader: nn.Module):
        """(s, y) = `add(x, residual)` ((x, self(x)) for residual None) for the block `reader` (a mixer or
        MLP) that reads y; where its first FP8 projection takes a prequantized y, y's FP8 form is
        written by the same kernel and offered to it (module docstring)."""
        return _add_for(self, True, x, residual, reader)

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

    def add_for(self, x: torch.Tensor, residual: torch.Tensor | None, reader: nn.Module):
        """As ZeroCenteredRMSNorm.add_for."""
        return _add_for(self, False, x, residual, reader)

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

    def project(self, x: torch.Tensor, z: torch.Tensor, proj: nn.Module) -> torch.Tensor:
        """proj(self(x, z) with its last two axes merged): x, z [B, T, H, D] -> [B, T, N]. For an FP8
        proj on a prequantized input (module docstring) one kernel writes the norm's output and its
        FP8 form, which proj's GEMM reads."""
        shape = (*x.shape[:-2], x.shape[-2] * x.shape[-1])
        if (isinstance(proj, Fp8Linear) and prequantized_ready(x, proj.weight, proj.bias)
                and quantized_ready(x, self.weight, z)):
            _, y, yq, row_scale = rms_norm_quantized(x, self.weight, self.eps, proj.input_scale, gate=z)
            return fp8_linear_quantized(y.reshape(shape), yq.reshape(shape), row_scale, proj.weight,
                                        proj.weight_scale, proj.input_scale, proj.bias)
        return proj(self(x, z).reshape(shape))

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"
