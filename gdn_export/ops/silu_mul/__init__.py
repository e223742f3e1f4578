"""silu(gate) * up, the SwiGLU MLP's activation: the contract shared by the PyTorch form and the fused
Triton kernel.

    silu_mul(gate, up) -> out
        gate, up  [..., I]  one dtype: fp32 / fp16 / bf16, one shape
        out       [..., I]  their dtype: round(round(silu(gate)) * up), silu and the product in fp32,
                  each rounded to the dtype (PyTorch's F.silu(gate) * up: the exported graph's
                  arithmetic, so the two agree bit for bit up to the fp32 silu's last bit)

Where it runs: the fused kernel (kernels/silu_mul/triton/) where gdn_export.ops.backends.fused_eager
says (eager mode on CUDA tensors, a backend other than "reference" active; GDN_EXPORT_FUSED_KERNELS=0
turns it off); everywhere else the PyTorch form in `naive.py` (torch.export, torch.compile, CPU).
"""

from __future__ import annotations

import torch

from gdn_export.ops import backends
from gdn_export.ops.silu_mul import naive

_KERNEL: list = []  # [kernels.silu_mul.triton.silu_mul module or None] once looked up


def _kernel():
    if not _KERNEL:
        try:
            from kernels.silu_mul.triton import silu_mul as module
        except ImportError:
            module = None
        _KERNEL.append(module)
    return _KERNEL[0]


def fused_ready(gate: torch.Tensor, up: torch.Tensor) -> bool:
    """Whether `silu_mul` takes the fused kernel: backends.fused_eager, one shape, dtype and device,
    a dtype the kernel takes, at least one dimension."""
    if not backends.fused_eager(gate, up):
        return False
    kernel = _kernel()
    return (kernel is not None and gate.dim() >= 1 and gate.dtype in kernel.DTYPES and up.shape == gate.shape
            and up.dtype == gate.dtype and up.device == gate.device)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t [..., I] as [R, I] with unit stride along I: a view where one exists, else a copy."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 or t2.shape[-1] <= 1 else t2.contiguous()


def silu_mul_fused(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The fused kernel alone (no dispatch; CUDA tensors, or CPU under TRITON_INTERPRET=1): gate, up
    [..., I] -> out [..., I], written into `out` (contiguous, their shape and dtype) when given.
    ValueError naming what breaks the contract."""
    kernel = _kernel()
    if kernel is None:
        raise ValueError("silu_mul_fused: Triton is not importable here")
    if gate.dim() < 1 or gate.dtype not in kernel.DTYPES:
        raise ValueError(f"silu_mul_fused: gate must be [..., I] fp32 / fp16 / bf16, got {tuple(gate.shape)} "
                         f"{gate.dtype}")
    if up.shape != gate.shape or up.dtype != gate.dtype:
        raise ValueError(f"silu_mul_fused: up must be gate's {tuple(gate.shape)} {gate.dtype}, got "
                         f"{tuple(up.shape)} {up.dtype}")
    if out is None:
        out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    elif out.shape != gate.shape or out.dtype != gate.dtype or not out.is_contiguous():
        raise ValueError(f"silu_mul_fused: out must be contiguous {tuple(gate.shape)} {gate.dtype}, got "
                         f"{tuple(out.shape)} {out.dtype}")
    kernel.silu_mul_rows(_rows(gate), _rows(up), out.view(-1, gate.shape[-1]))
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """out [..., I] in gate's dtype (the contract above): the fused kernel where `fused_ready`, else
    the PyTorch form."""
    if fused_ready(gate, up):
        return silu_mul_fused(gate, up)
    return naive.silu_mul(gate, up)
