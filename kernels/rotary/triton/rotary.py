"""Partial rotary position embedding (rotate_half convention) in one kernel.

    x         [B, H, T, D]  fp32 / fp16 / bf16, unit stride along D, any other strides (the attention's
                            q / k: transposed views of [B, T, H, D] projections)
    cos, sin  [B, T, R]     x's dtype, contiguous, R <= D even
    out       [B, H, T, D]  x's dtype, contiguous:
              c < R:   round(round(x[c] cos[c]) + round(r[c] sin[c])), r = rotate_half(x[:R]):
                       r[c] = -x[c + R/2] for c < R/2, x[c - R/2] above
              c >= R:  x[c]
              each product and the sum rounded to x's dtype, as PyTorch's x * cos + rotate_half(x) * sin
              rounds them (the exported graph's arithmetic)

Compiled without floating-point contraction (FP_FUSION): with it, LLVM narrows each rounded 16-bit
product and sum to a native 16-bit multiply and add (exact rewrites) and the backend then fuses them
into fma.rn.bf16x2 / fma.rn.f32, which skips the product's rounding (on an H100: 75-80% of the
rotated channels equal to PyTorch's bit for bit, instead of all of them).

One pass where PyTorch's form takes ~8 kernels per tensor (two slices' products, a negation, two
concatenations, the sum), strided reads among them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_utils import cdiv, next_pow2, pdl_enter, pdl_launch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TILE = 2048  # elements a program holds (4096 took ~165 registers a thread at 4 warps)
FP_FUSION = False  # triton's enable_fp_fusion launch option (module docstring)


@triton.jit
def rotary_kernel(x, cos, sin, out, H, T, D, R,
                  stride_xb, stride_xh, stride_xt,
                  BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_enter(USE_PDL)
    i_t, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = i_t * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.arange(0, BLOCK_D)
    t_ok = t < T
    ok = t_ok[:, None] & (c < D)[None, :]
    rot = c < R
    half = R // 2
    partner = tl.where(c < half, c + half, c - half)
    base = x + i_b.to(tl.int64) * stride_xb + i_h.to(tl.int64) * stride_xh + t.to(tl.int64)[:, None] * stride_xt
    b_x = tl.load(base + c[None, :], mask=ok, other=0.0)
    rok = t_ok[:, None] & rot[None, :]
    b_p = tl.load(base + partner[None, :], mask=rok, other=0.0).to(tl.float32)
    b_p = tl.where((c < half)[None, :], -b_p, b_p)
    cs = (i_b.to(tl.int64) * T + t.to(tl.int64))[:, None] * R + c[None, :]
    b_cos = tl.load(cos + cs, mask=rok, other=0.0).to(tl.float32)
    b_sin = tl.load(sin + cs, mask=rok, other=0.0).to(tl.float32)
    dtype = out.dtype.element_ty
    first = (b_x.to(tl.float32) * b_cos).to(dtype).to(tl.float32)
    second = (b_p * b_sin).to(dtype).to(tl.float32)
    y = tl.where(rot[None, :], (first + second).to(dtype), b_x.to(dtype))
    o = out + ((i_b.to(tl.int64) * H + i_h) * T + t.to(tl.int64))[:, None] * D + c[None, :]
    tl.store(o, y, mask=ok)


def launch_config(T: int, D: int) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_D, num_warps) for T tokens of D channels."""
    block_d = max(16, next_pow2(D))
    block_t = max(1, min(TILE // block_d, next_pow2(T)))
    return block_t, block_d, 4 if block_t * block_d >= 2048 else 1


def rotary_heads(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Launch over x [B, H, T, D] (unit stride along D), cos / sin [B, T, R] contiguous, into out
    [B, H, T, D] contiguous; returns out. Callers check shapes and dtypes (gdn_export.ops.rotary)."""
    B, H, T, D = x.shape
    if x.numel() == 0:
        return out
    block_t, block_d, num_warps = launch_config(T, D)
    rotary_kernel[(cdiv(T, block_t), H, B)](
        x, cos, sin, out, H, T, D, cos.shape[-1], x.stride(0), x.stride(1), x.stride(2),
        BLOCK_T=block_t, BLOCK_D=block_d, num_warps=num_warps, enable_fp_fusion=FP_FUSION, **pdl_launch(out))
    return out
