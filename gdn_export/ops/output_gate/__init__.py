"""The gated attention's output gate (Qwen3-Next / Qwen3.5): the heads back in token order, times the
sigmoid of the gate half of the q projection. The contract shared by the PyTorch form and the fused
Triton kernel.

    output_gate(o, gate) -> out
        o     [B, H, T, D]  fp32 / fp16 / bf16, the attention's output (heads first)
        gate  [B, T, H, D]  o's dtype (the attention's gate: per head, interleaved with q in the q
                            projection's output, so a strided view)
        out   [B, T, H D]   o's dtype: round(o * round(sigmoid(gate))), sigmoid and the product in fp32,
                            each rounded to the dtype (PyTorch's o.transpose(1, 2).reshape(B, T, H D)
                            * torch.sigmoid(gate.reshape(B, T, H D)): the exported graph's arithmetic)

    output_gate_quantized(o, gate, input_scale) -> (out, outq, row_scale)   (the fused kernel only;
        eager, on a GPU: `fused_ready` and 16-bit o)
        outq       [B, T, H D] float8_e4m3fn: e4m3(clamp(out / input_scale, +-448)) of the rounded out,
                   bit for bit the FP8 output projection's x pass over out (its
                   gdn_export.ops.quant_linear.fp8_linear_quantized reads outq)
        row_scale  [B T, 1] fp32: input_scale per token

Where it runs: the fused kernel (kernels/output_gate/triton/) where gdn_export.ops.backends.fused_eager
says (eager mode on CUDA tensors, a backend other than "reference" active, no gradient asked for;
GDN_EXPORT_FUSED_KERNELS=0 turns it off); everywhere else the PyTorch form in `naive.py`.
"""

from __future__ import annotations

import torch

from gdn_export.ops import backends, glue
from gdn_export.ops.output_gate import naive


KERNEL = "kernels.output_gate.triton.output_gate"


def _kernel():
    return glue.kernel_module(KERNEL)


def fused_ready(o: torch.Tensor, gate: torch.Tensor) -> bool:
    """Whether `output_gate` takes the fused kernel: backends.fused_eager, o [B, H, T, D] and gate
    [B, T, H, D] of one kernel dtype on one device, each with unit stride along D."""
    if not backends.fused_eager(o, gate):
        return False
    kernel = _kernel()
    if kernel is None or o.dim() != 4 or gate.dim() != 4 or o.dtype not in kernel.DTYPES:
        return False
    B, H, T, D = o.shape
    return (tuple(gate.shape) == (B, T, H, D) and gate.dtype == o.dtype and gate.device == o.device
            and (o.stride(-1) == 1 or D <= 1) and (gate.stride(-1) == 1 or D <= 1))


def output_gate_fused(o: torch.Tensor, gate: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The fused kernel alone (no dispatch; CUDA tensors, or CPU under TRITON_INTERPRET=1): o [B, H, T, D],
    gate [B, T, H, D] -> out [B, T, H D], written into `out` (contiguous, that shape, o's dtype) when
    given. ValueError naming what breaks the contract."""
    kernel = glue.fused_kernel(KERNEL, "output_gate_fused", o, "o must be [B, H, T, D]", 4)
    B, H, T, D = o.shape
    if tuple(gate.shape) != (B, T, H, D) or gate.dtype != o.dtype:
        raise ValueError(f"output_gate_fused: gate must be [{B}, {T}, {H}, {D}] {o.dtype}, got {tuple(gate.shape)} "
                         f"{gate.dtype}")
    if out is None:
        out = torch.empty(B, T, H * D, dtype=o.dtype, device=o.device)
    elif tuple(out.shape) != (B, T, H * D) or out.dtype != o.dtype or not out.is_contiguous():
        raise ValueError(f"output_gate_fused: out must be contiguous [{B}, {T}, {H * D}] {o.dtype}, got "
                         f"{tuple(out.shape)} {out.dtype}")
    o = o if o.stride(-1) == 1 else o.contiguous()
    gate = gate if gate.stride(-1) == 1 else gate.contiguous()
    kernel.output_gate_heads(o, gate, out)
    return out


def output_gate_quantized(o: torch.Tensor, gate: torch.Tensor, input_scale: torch.Tensor):
    """(out, outq, row_scale) (the contract above) in one kernel: the output gate and its FP8 form under
    input_scale (fp32, one element). Callers check `fused_ready` and a 16-bit o first; ValueError
    naming what breaks the contract."""
    if o.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"output_gate_quantized: o must be fp16 / bf16, got {o.dtype}")
    if input_scale.numel() != 1 or input_scale.dtype != torch.float32:
        raise ValueError(f"output_gate_quantized: input_scale must be one fp32 value, got "
                         f"{tuple(input_scale.shape)} {input_scale.dtype}")
    kernel = glue.fused_kernel(KERNEL, "output_gate_quantized", o, "o must be [B, H, T, D]", 4)
    B, H, T, D = o.shape
    if tuple(gate.shape) != (B, T, H, D) or gate.dtype != o.dtype:
        raise ValueError(f"output_gate_quantized: gate must be [{B}, {T}, {H}, {D}] {o.dtype}, got "
                         f"{tuple(gate.shape)} {gate.dtype}")
    from kernels.quant_linear.triton.common import empty

    out = torch.empty(B, T, H * D, dtype=o.dtype, device=o.device)
    outq = empty(B, T, H * D, dtype=torch.float8_e4m3fn, device=o.device)
    row_scale = empty(B * T, 1, dtype=torch.float32, device=o.device)
    o = o if o.stride(-1) == 1 else o.contiguous()
    gate = gate if gate.stride(-1) == 1 else gate.contiguous()
    kernel.output_gate_heads(o, gate, out, outq, input_scale.reshape(1), row_scale)
    return out, outq, row_scale


def output_gate(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """out [B, T, H D] in o's dtype (the contract above): the fused kernel where `fused_ready`, else the
    PyTorch form."""
    if fused_ready(o, gate):
        return output_gate_fused(o, gate)
    return naive.output_gate(o, gate)
