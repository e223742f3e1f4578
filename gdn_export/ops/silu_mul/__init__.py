"""silu(gate) * up, the SwiGLU MLP's activation: the contract shared by the PyTorch form and the fused
Triton kernel.

    silu_mul(gate, up) -> out
        gate, up  [..., I]  one dtype: fp32 / fp16 / bf16, one shape
        out       [..., I]  their dtype: round(round(silu(gate)) * up), silu and the product in fp32,
                  each rounded to the dtype (PyTorch's F.silu(gate) * up: the exported graph's
                  arithmetic, so the two agree bit for bit up to the fp32 silu's last bit)

Where it runs: the fused kernel (kernels/silu_mul/triton/) where gdn_export.ops.backends.fused_eager
says (eager mode on CUDA tensors, a backend other than "reference" active, no gradient asked for;
GDN_EXPORT_FUSED_KERNELS=0 turns it off); everywhere else the PyTorch form in `naive.py` (torch.export, torch.compile, CPU).
"""

from __future__ import annotations

import torch

from gdn_export.ops import backends, glue
from gdn_export.ops.silu_mul import naive


def _kernel():
    return glue.kernel_module("kernels.silu_mul.triton.silu_mul")


def fused_ready(gate: torch.Tensor, up: torch.Tensor) -> bool:
    """Whether `silu_mul` takes the fused kernel: backends.fused_eager, one shape, dtype and device,
    a dtype the kernel takes, at least one dimension."""
    if not backends.fused_eager(gate, up):
        return False
    kernel = _kernel()
    return (kernel is not None and gate.dim() >= 1 and gate.dtype in kernel.DTYPES and up.shape == gate.shape
            and up.dtype == gate.dtype and up.device == gate.device)


def silu_mul_fused(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The fused kernel alone (no dispatch; CUDA tensors, or CPU under TRITON_INTERPRET=1): gate, up
    [..., I] -> out [..., I], written into `out` (contiguous, their shape and dtype) when given.
    ValueError naming what breaks the contract."""
    kernel = glue.require(_kernel(), "silu_mul_fused")
    if gate.dim() < 1 or gate.dtype not in kernel.DTYPES:
        raise ValueError(f"silu_mul_fused: gate must be [..., I] fp32 / fp16 / bf16, got {tuple(gate.shape)} "
                         f"{gate.dtype}")
    if up.shape != gate.shape or up.dtype != gate.dtype:
        raise ValueError(f"silu_mul_fused: up must be gate's {tuple(gate.shape)} {gate.dtype}, got "
                         f"{tuple(up.shape)} {up.dtype}")
    out = glue.output(out, gate, "silu_mul_fused")
    kernel.silu_mul_rows(glue.rows(gate), glue.rows(up), out.view(-1, gate.shape[-1]))
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """out [..., I] in gate's dtype (the contract above): the fused kernel where `fused_ready`, else
    the PyTorch form."""
    if fused_ready(gate, up):
        return silu_mul_fused(gate, up)
    return naive.silu_mul(gate, up)
