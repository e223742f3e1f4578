"""silu(gate) * up in one kernel: the SwiGLU MLP's activation between its projections.

    gate, up  [R, I]  fp32 / fp16 / bf16 (one dtype), unit stride along I, any row stride (the two
                      halves of the fused gate / up projection's [R, 2I] output are such views)
    out       [R, I]  their dtype, unit stride along I, any row stride:
              out = round(round(silu(gate)) * up), silu and the product in fp32, each rounded to the
              dtype as PyTorch's F.silu(gate) * up rounds them (the exported graph's arithmetic); silu
              as PyTorch's CUDA kernel computes it (libdevice expf, IEEE division), so on a GPU the
              kernel equals F.silu(gate) * up bit for bit
    out (FP8) [R, I]  float8_e4m3fn, unit stride along I: e4m3(clamp(y / input_scale, +-448)) of the
              16-bit y above, the quotient correctly rounded: bit for bit fp8_linear's x pass over y
              (kernels/quant_linear), so an FP8 down projection reads it instead of y

One pass: reads gate and up once and writes out once. PyTorch's form on the strided halves runs two
non-vectorised kernels and writes and reads silu(gate) in between (a 4096-token prefill of the
1.66B Qwen3.5 shape: [4096, 6144] halves, 24 MLPs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.quant_linear.triton.common import SOFT_FP8, quantize_activation
from kernels.triton_utils import cdiv, exp_libm, next_pow2, pdl_enter, pdl_launch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BLOCK_C = 1024
TILE = 4096  # elements a program holds
# triton's enable_fp_fusion launch option: with it, 1 + expf(-x) fuses with expf's last multiply into
# one fma (on an H100, 1.18x the fp16 bound from the float64 oracle at [4096, 6144])
FP_FUSION = False


@triton.jit
def silu_mul_kernel(gate, up, out, s_in, row_scale, R, I, stride_g, stride_u, stride_o,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, USE_PDL: tl.constexpr,
                    QUANT: tl.constexpr = False, SOFT: tl.constexpr = False):
    """QUANT: out is float8_e4m3fn, e4m3(clamp(y / s_in, +-448)) of the 16-bit y (the FP8 down
    projection's x pass of fp8_linear, fused), s_in a one-element fp32 tensor, and row_scale [R]
    receives s_in per row (torch._scaled_mm's rowwise scale)."""
    pdl_enter(USE_PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = (rows < R)[:, None] & (cols < I)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    b_g = tl.load(gate + r64 * stride_g + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    b_u = tl.load(up + r64 * stride_u + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    dtype = gate.dtype.element_ty
    # PyTorch's CUDA silu: x / (1 + expf(-x)), IEEE division (Triton's `/` is div.full, 2 ulp)
    act = tl.math.div_rn(b_g, 1.0 + exp_libm(-b_g)).to(dtype).to(tl.float32)
    y = (act * b_u).to(dtype)
    if QUANT:
        s = tl.load(s_in)
        y = quantize_activation(y.to(tl.float32), s, True, SOFT)
        if tl.program_id(1) == 0:
            tl.store(row_scale + rows, tl.zeros([BLOCK_R], tl.float32) + s, mask=rows < R)
    tl.store(out + r64 * stride_o + cols[None, :], y, mask=ok)


def launch_config(R: int, I: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_C, num_warps) for R rows of I columns."""
    block_c = min(BLOCK_C, max(16, next_pow2(I)))
    block_r = max(1, min(TILE // block_c, next_pow2(R)))
    return block_r, block_c, 4


def silu_mul_rows(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor,
                  input_scale: torch.Tensor | None = None, row_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Launch over gate, up [R, I] (unit stride along I) into out [R, I]; returns out. With
    input_scale (fp32, one element) out is float8_e4m3fn, the product quantized as fp8_linear's x,
    and row_scale [R, 1] fp32 receives input_scale per row (module docstring). Callers check shapes
    and dtypes (gdn_export.ops.silu_mul, kernels.quant_linear.gpu)."""
    R, I = gate.shape
    if R == 0 or I == 0:
        return out
    block_r, block_c, num_warps = launch_config(R, I)
    quant = input_scale is not None
    silu_mul_kernel[(cdiv(R, block_r), cdiv(I, block_c))](
        gate, up, out, input_scale if quant else out, row_scale if quant else out,
        R, I, gate.stride(0), up.stride(0), out.stride(0),
        BLOCK_R=block_r, BLOCK_C=block_c, QUANT=quant, SOFT=SOFT_FP8, num_warps=num_warps,
        enable_fp_fusion=FP_FUSION, **pdl_launch(out))
    return out
