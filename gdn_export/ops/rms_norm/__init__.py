"""RMSNorm: the contract shared by the PyTorch form and the fused Triton kernel.

    rms_norm(x, weight, eps, zero_centered=False, gate=None) -> y
        x       [..., D]  fp32 / fp16 / bf16
        weight  [D]       any float dtype
        gate    [..., D]  x's shape, or None
        y       [..., D]  x's dtype: x * rsqrt(mean(x^2) + eps) * w * silu(gate), fp32 math rounded once;
                w = 1 + weight when zero_centered (Qwen3-Next / Qwen3.5's stored weight centred on 0),
                else weight; silu(gate) only with a gate (the GDN output norm, per value head)

    add_rms_norm(x, residual, weight, eps, zero_centered=False) -> (s, y)
        x, residual  [..., D]  one shape and dtype (the decoder's residual stream and a block's output)
        s       [..., D]  x + residual in x's dtype (PyTorch's add: fp32 sum rounded once)
        y       [..., D]  rms_norm(s, weight, eps, zero_centered)

    rms_norm_quantized(x, weight, eps, input_scale, zero_centered=False, gate=None, residual=None)
        -> (s, y, yq, row_scale)   (the fused kernel only; eager, on a GPU: `quantized_ready`)
        s, y    as add_rms_norm with a residual (s None without), else as rms_norm
        yq      [..., D] float8_e4m3fn: e4m3(clamp(y / input_scale, +-448)) of the 16-bit y, bit for
                bit an FP8 projection's x pass over y (gdn_export.ops.quant_linear: its
                fp8_linear_quantized reads yq instead of quantizing y again)
        row_scale [R, 1] fp32: input_scale per row of the projection input: x [..., D] without a gate
                (R = numel / D), x [..., H, D] with one (the GDN output norm, per value head: the
                projection reads H D a row, R = numel / (H D))

Where it runs: the fused kernel (kernels/rms_norm/triton/) where gdn_export.ops.backends.fused_eager
says (eager mode on CUDA tensors, a backend other than "reference" active, no gradient asked for;
GDN_EXPORT_FUSED_KERNELS=0 turns it off); everywhere else the PyTorch form in `naive.py`, which torch.export (the ONNX graph)
and torch.compile (Inductor fuses it) see. The two agree to fp32 rounding before the one rounding to x's
dtype: relative RMS <= 1e-6 in fp32, one ulp of x's dtype per element in fp16 / bf16.
"""

from __future__ import annotations

import torch

from gdn_export.ops import backends, glue
from gdn_export.ops.rms_norm import naive


def _kernel():
    return glue.kernel_module("kernels.rms_norm.triton.rms_norm")


def fused_ready(x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor | None = None) -> bool:
    """Whether `rms_norm` takes the fused kernel for these tensors: backends.fused_eager (the weight,
    an nn.Parameter, goes in as a parameter: no plain-tensor check, its requires_grad counted), x in
    the kernel's dtypes with D <= its MAX_D, weight [D] and gate (or add_rms_norm's residual) x's shape
    and dtype on x's device."""
    if not backends.fused_eager(x, gate, params=(weight,)):
        return False
    kernel = _kernel()
    if kernel is None or x.dtype not in kernel.DTYPES or not 1 <= x.shape[-1] <= kernel.MAX_D:
        return False
    if weight.shape != x.shape[-1:] or weight.device != x.device or not weight.is_floating_point():
        return False
    return gate is None or (gate.shape == x.shape and gate.dtype == x.dtype and gate.device == x.device)


def _checked_kernel(x: torch.Tensor, weight: torch.Tensor, op: str):
    """The kernel module, after x's and weight's checks (ValueError naming `op`)."""
    kernel = glue.require(_kernel(), op)
    D = x.shape[-1] if x.dim() else 0
    if x.dtype not in kernel.DTYPES or not 1 <= D <= kernel.MAX_D:
        raise ValueError(f"{op}: x must be [..., D] fp32 / fp16 / bf16 with 1 <= D <= {kernel.MAX_D}, "
                         f"got {tuple(x.shape)} {x.dtype}")
    if tuple(weight.shape) != (D,) or not weight.is_floating_point():
        raise ValueError(f"{op}: weight must be a float [D={D}], got {tuple(weight.shape)} {weight.dtype}")
    return kernel


def rms_norm_fused(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool = False,
                   gate: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The fused kernel alone (no dispatch; CUDA tensors, or CPU under TRITON_INTERPRET=1): x [..., D],
    weight [D], gate [..., D] or None -> y [..., D] in x's dtype, written into `out` (contiguous, x's
    shape and dtype) when given. ValueError naming what breaks the contract."""
    kernel = _checked_kernel(x, weight, "rms_norm_fused")
    if gate is not None and (gate.shape != x.shape or gate.dtype != x.dtype):
        raise ValueError(f"rms_norm_fused: gate must be x's {tuple(x.shape)} {x.dtype}, got {tuple(gate.shape)} "
                         f"{gate.dtype}")
    out = glue.output(out, x, "rms_norm_fused")
    gate_rows = None if gate is None else glue.head_rows(gate)
    kernel.rms_norm_rows(glue.head_rows(x), weight.contiguous(), eps, zero_centered, gate_rows, glue.head_rows(out))
    return out


def add_rms_norm_fused(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       zero_centered: bool = False, out: torch.Tensor | None = None,
                       out_sum: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused residual add and norm alone (as rms_norm_fused): x, residual [..., D] -> (s, y) in x's
    dtype, written into `out_sum` / `out` (each contiguous, x's shape and dtype) when given."""
    kernel = _checked_kernel(x, weight, "add_rms_norm_fused")
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"add_rms_norm_fused: residual must be x's {tuple(x.shape)} {x.dtype}, got "
                         f"{tuple(residual.shape)} {residual.dtype}")
    out = glue.output(out, x, "add_rms_norm_fused")
    out_sum = glue.output(out_sum, x, "add_rms_norm_fused")
    kernel.rms_norm_rows(glue.head_rows(x), weight.contiguous(), eps, zero_centered, None, glue.head_rows(out),
                         residual=glue.head_rows(residual), s=glue.head_rows(out_sum))
    return out_sum, out


def quantized_ready(x: torch.Tensor, weight: torch.Tensor, other: torch.Tensor | None = None) -> bool:
    """Whether `rms_norm_quantized` runs: `fused_ready(x, weight, other)` (other: the gate or the
    residual) and 16-bit x."""
    return x.dtype in (torch.float16, torch.bfloat16) and fused_ready(x, weight, other)


def rms_norm_quantized(x: torch.Tensor, weight: torch.Tensor, eps: float, input_scale: torch.Tensor,
                       zero_centered: bool = False, gate: torch.Tensor | None = None,
                       residual: torch.Tensor | None = None):
    """(s, y, yq, row_scale) (the contract above) in one kernel: the norm of x (of x + residual) and its
    FP8 quantization under input_scale (fp32, one element). Callers check `quantized_ready` first;
    ValueError naming what breaks the contract."""
    kernel = _checked_kernel(x, weight, "rms_norm_quantized")
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"rms_norm_quantized: x must be fp16 / bf16, got {x.dtype}")
    if gate is not None and residual is not None:
        raise ValueError("rms_norm_quantized: a gate or a residual, not both")
    other = gate if gate is not None else residual
    if other is not None and (other.shape != x.shape or other.dtype != x.dtype):
        raise ValueError(f"rms_norm_quantized: {'gate' if gate is not None else 'residual'} must be x's "
                         f"{tuple(x.shape)} {x.dtype}, got {tuple(other.shape)} {other.dtype}")
    if input_scale.numel() != 1 or input_scale.dtype != torch.float32:
        raise ValueError(f"rms_norm_quantized: input_scale must be one fp32 value, got {tuple(input_scale.shape)} "
                         f"{input_scale.dtype}")
    from kernels.quant_linear.triton.common import empty

    y = glue.output(None, x, "rms_norm_quantized")
    yq = empty(*x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = None if residual is None else glue.output(None, x, "rms_norm_quantized")
    # the projection's rows: (token, head) pairs of one row each with a gate, else every row
    rows = glue.head_rows if gate is not None else glue.rows
    xr = rows(x)
    row_scale = empty(xr.shape[0], 1, dtype=torch.float32, device=x.device)
    kernel.rms_norm_rows(xr, weight.contiguous(), eps, zero_centered, None if gate is None else rows(gate), rows(y),
                         residual=None if residual is None else rows(residual), s=None if s is None else rows(s),
                         yq=rows(yq), input_scale=input_scale.reshape(1), row_scale=row_scale)
    return s, y, yq, row_scale


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool = False,
             gate: torch.Tensor | None = None) -> torch.Tensor:
    """y [..., D] in x's dtype (the contract above): the fused kernel where `fused_ready`, else the
    PyTorch form."""
    if fused_ready(x, weight, gate):
        return rms_norm_fused(x, weight, eps, zero_centered, gate)
    return naive.rms_norm(x, weight, eps, zero_centered, gate)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 zero_centered: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, y) [..., D] in x's dtype (the contract above): one kernel where `fused_ready(x, weight,
    residual)`, else the PyTorch add and norm."""
    if fused_ready(x, weight, residual):
        return add_rms_norm_fused(x, residual, weight, eps, zero_centered)
    return naive.add_rms_norm(x, residual, weight, eps, zero_centered)
