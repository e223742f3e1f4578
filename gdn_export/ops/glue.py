"""What the ops with an eager glue kernel share (gdn_export.ops.rms_norm, .silu_mul,
.gated_delta_rule.gating, .rotary, .output_gate; docs/backends.md): their Triton module imported on
first use and checked (`fused_kernel`), their inputs as row views (`rows`, or `head_rows`: rows at two
strides), their output buffer checked."""

from __future__ import annotations

import functools
import importlib

import torch


@functools.cache
def kernel_module(name: str):
    """The kernels module `name` (e.g. "kernels.rms_norm.triton.rms_norm"), or None where it does not
    import (no Triton)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def require(kernel, op: str):
    """`kernel` (a kernel_module result) for the fused entry `op`; ValueError when it did not import."""
    if kernel is None:
        raise ValueError(f"{op}: Triton is not importable here")
    return kernel


def fused_kernel(name: str, op: str, x: torch.Tensor, shape: str, dim: int):
    """The kernels module `name` for the fused entry `op`, after its first input x's check: rank `dim`
    and a dtype in the module's DTYPES (`shape` names x's layout in the ValueError)."""
    kernel = require(kernel_module(name), op)
    if x.dim() != dim or x.dtype not in kernel.DTYPES:
        raise ValueError(f"{op}: {shape} fp32 / fp16 / bf16, got {tuple(x.shape)} {x.dtype}")
    return kernel


def rows(t: torch.Tensor) -> torch.Tensor:
    """t [..., D] as [R, D] with unit stride along D: a view where one exists (the slices of a fused
    projection's output are), else a copy."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 or t2.shape[-1] <= 1 else t2.contiguous()


def head_rows(t: torch.Tensor) -> torch.Tensor:
    """t [..., H, D] as [R, H, D] with unit stride along D (t [D] or [R, D] as [R, 1, D]): a view
    where one exists (a head split [B, T, H, D] of one slice of a fused projection's output is one:
    its rows are (token, head) at two strides, which `rows` would copy), else a copy."""
    if t.dim() < 3:
        t3 = t.reshape(-1, 1, t.shape[-1])
    else:
        t3 = t.reshape(-1, t.shape[-2], t.shape[-1])
    return t3 if t3.stride(-1) == 1 or t3.shape[-1] <= 1 else t3.contiguous()


def output(out: torch.Tensor | None, like: torch.Tensor, op: str) -> torch.Tensor:
    """`out` when it is contiguous in like's shape and dtype (else a ValueError naming `op`), or a new
    tensor so; on like's device."""
    if out is None:
        return torch.empty(like.shape, dtype=like.dtype, device=like.device)
    if out.shape != like.shape or out.dtype != like.dtype or not out.is_contiguous():
        raise ValueError(f"{op}: out must be contiguous {tuple(like.shape)} {like.dtype}, got {tuple(out.shape)} "
                         f"{out.dtype}")
    return out
