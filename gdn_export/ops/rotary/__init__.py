"""Partial rotary position embedding (transformers' rotate_half convention): the contract shared by
the PyTorch form and the fused Triton kernel.

    apply_rotary(x, cos, sin) -> out
        x         [B, H, T, D]  fp32 / fp16 / bf16, any strides
        cos, sin  [B, T, R]     R <= D even (the first R channels of every head rotate; channel c
                                pairs with c + R/2)
        out       [B, H, T, D]  x's dtype: x[:R] * cos + rotate_half(x[:R]) * sin, then x[R:] as is;
                  with cos / sin in x's dtype each product and the sum round to it (PyTorch's form,
                  the exported graph's arithmetic)

Where it runs: the fused kernel (kernels/rotary/triton/) where gdn_export.ops.backends.fused_eager
says (eager mode on CUDA tensors, a backend other than "reference", no gradient asked for;
GDN_EXPORT_FUSED_KERNELS=0 turns it off) and cos / sin are x's dtype, [B, T, R]; everywhere else
the PyTorch form (`apply_rotary_torch`), which torch.export and torch.compile see.
"""

from __future__ import annotations

import torch

from gdn_export.ops import backends, glue


KERNEL = "kernels.rotary.triton.rotary"


def _kernel():
    return glue.kernel_module(KERNEL)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The PyTorch form of `apply_rotary` (the graph's nodes)."""
    rotary_dim = cos.shape[-1]
    cos, sin = cos[:, None], sin[:, None]
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    x_rot = x_rot * cos + rotate_half(x_rot) * sin
    return torch.cat((x_rot, x_pass), dim=-1)


def fused_ready(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether `apply_rotary` takes the fused kernel: backends.fused_eager, x [B, H, T, D] in a kernel
    dtype, cos / sin [B, T, R] in x's dtype on its device with 2 <= R <= D even."""
    if not backends.fused_eager(x, cos, sin):
        return False
    kernel = _kernel()
    if kernel is None or x.dim() != 4 or x.dtype not in kernel.DTYPES:
        return False
    B, _, T, D = x.shape
    R = cos.shape[-1]
    return (cos.shape == sin.shape == (B, T, R) and 2 <= R <= D and R % 2 == 0 and cos.dtype == sin.dtype == x.dtype
            and cos.device == sin.device == x.device)


def apply_rotary_fused(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """The fused kernel alone (no dispatch; CUDA tensors, or CPU under TRITON_INTERPRET=1), written into
    `out` (contiguous, x's shape and dtype) when given. ValueError naming what breaks the contract."""
    kernel = glue.fused_kernel(KERNEL, "apply_rotary_fused", x, "x must be [B, H, T, D]", 4)
    B, _, T, D = x.shape
    R = cos.shape[-1] if cos.dim() else 0
    if cos.shape != sin.shape or tuple(cos.shape) != (B, T, R) or not (2 <= R <= D and R % 2 == 0):
        raise ValueError(f"apply_rotary_fused: cos and sin must be [B, T, R] = ({B}, {T}, R) with R even, "
                         f"2 <= R <= D = {D}, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise ValueError(f"apply_rotary_fused: cos and sin must be x's {x.dtype}, got {cos.dtype} and {sin.dtype}")
    out = glue.output(out, x, "apply_rotary_fused")
    src = x if x.stride(-1) == 1 or D == 1 else x.contiguous()
    return kernel.rotary_heads(src, cos.contiguous(), sin.contiguous(), out)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """out [B, H, T, D] (the contract above): the fused kernel where `fused_ready`, else the PyTorch form."""
    if fused_ready(x, cos, sin):
        return apply_rotary_fused(x, cos, sin)
    return apply_rotary_torch(x, cos, sin)
