"""RMSNorm in one kernel: plain, zero-centred and gated (the three norms of the hybrid families), and the
decoder's residual add before a plain or zero-centred norm.

    x       [R1, H, D]  fp32 / fp16 / bf16, unit stride along D, any other strides: rows r = (r1, h),
                        R = R1 H of them (a head-split view such as [B T, H, D] of one slice of a fused
                        projection's output is read in place: no copy)
    res     [R1, H, D]  x's dtype (residual add only), unit stride along D, any other strides
    s       [R1, H, D]  x's dtype (residual add only): x + res in fp32, rounded once to x's dtype
                        (PyTorch's add); the norm below then reads s in place of x
    weight  [D]         any float dtype, unit stride
    gate    [R1, H, D]  x's dtype (gated only), unit stride along D, any other strides
    y       [R1, H, D]  x's dtype, unit stride along D, any other strides:
            y = x * rsqrt(mean(x^2) + eps) * w * silu(gate), all in fp32, rounded once to y's dtype;
            w = 1 + weight (zero-centred) or weight; the silu factor only when gated
    yq      [R1, H, D]  float8_e4m3fn (FP8 output only), y's strides: e4m3(clamp(y / input_scale,
                        +-448)) of the 16-bit y, the quotient correctly rounded: bit for bit the x pass
                        of an FP8 projection over y (kernels/quant_linear quantize_tensor), which then
                        reads yq instead of y; row_scale [R1] fp32 receives input_scale per row r1
                        (torch._scaled_mm's rowwise scale of the [R1, H D] projection input)

One program normalises BLOCK_R rows of BLOCK_D >= D columns held in registers: a 4096-token prefill
norm of [4096, 2048] bf16 reads 16 MiB and writes 16 MiB once, where the unfused PyTorch form (cast,
square, mean, rsqrt, two products, cast back) makes ~8 passes over an fp32 copy and launches ~8
kernels (a decode step's norm is launch-bound: one launch instead of ~8).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.quant_linear.triton.common import SOFT_FP8, quantize_activation
from kernels.triton_utils import cdiv, next_pow2, pdl_enter, pdl_launch

# Widest row held in registers (hidden sizes of the families: 2048 .. 8192).
MAX_D = 16384
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Elements one program holds: rows per program = TILE // BLOCK_D (at least 1).
TILE = 4096


@triton.jit
def rms_norm_kernel(x, w, g, y, res, s, R, D, H, stride_x, stride_xh, stride_g, stride_gh, stride_y, stride_yh,
                    stride_res, stride_resh, stride_s, stride_sh, eps, yq, s_in, row_scale,
                    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, ZERO_CENTERED: tl.constexpr,
                    GATED: tl.constexpr, RESIDUAL: tl.constexpr, USE_PDL: tl.constexpr,
                    QUANT: tl.constexpr = False, SOFT: tl.constexpr = False):
    """Rows r = (r // H, r % H) of [R / H, H, D] tensors; stride_t / stride_th: each tensor's two row strides.
    QUANT: also yq (y's strides) = e4m3(clamp(y / s_in)) of the rounded y, s_in a one-element fp32
    tensor, and row_scale [R / H] = s_in."""
    pdl_enter(USE_PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    ok = (rows < R)[:, None] & col_ok[None, :]
    r1 = (rows // H).to(tl.int64)[:, None]
    rh = (rows % H).to(tl.int64)[:, None]
    b_x = tl.load(x + r1 * stride_x + rh * stride_xh + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    if RESIDUAL:
        b_r = tl.load(res + r1 * stride_res + rh * stride_resh + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        b_s = (b_x + b_r).to(s.dtype.element_ty)
        tl.store(s + r1 * stride_s + rh * stride_sh + cols[None, :], b_s, mask=ok)
        b_x = b_s.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(b_x * b_x, 1) / D + eps)
    b_w = tl.load(w + cols, mask=col_ok, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        b_w = b_w + 1.0
    out = b_x * rstd[:, None] * b_w[None, :]
    if GATED:
        b_g = tl.load(g + r1 * stride_g + rh * stride_gh + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        out = out * (b_g * tl.sigmoid(b_g))
    out = out.to(y.dtype.element_ty)
    tl.store(y + r1 * stride_y + rh * stride_yh + cols[None, :], out, mask=ok)
    if QUANT:
        scale = tl.load(s_in)
        tl.store(yq + r1 * stride_y + rh * stride_yh + cols[None, :],
                 quantize_activation(out.to(tl.float32), scale, True, SOFT), mask=ok)
        tl.store(row_scale + r1, tl.zeros([BLOCK_R, 1], tl.float32) + scale, mask=(rows < R)[:, None] & (rh == 0))


def launch_config(R: int, D: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_D, num_warps) for R rows of D columns."""
    block_d = max(16, next_pow2(D))
    block_r = max(1, min(TILE // block_d, next_pow2(R)))
    return block_r, block_d, min(8, max(1, block_r * block_d // 1024))


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool,
                  gate: torch.Tensor | None, y: torch.Tensor, residual: torch.Tensor | None = None,
                  s: torch.Tensor | None = None, yq: torch.Tensor | None = None,
                  input_scale: torch.Tensor | None = None, row_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Launch over x [R1, H, D] (unit stride along D; [R, D] is taken as [R, 1, D]), weight [D], gate
    (x's shape) or None, into y (x's shape); with `residual` (x's shape, no gate) the sum x + residual
    is written to s (x's shape) and normalised. With input_scale (fp32, one element) y is also written
    quantized to yq (float8_e4m3fn, y's shape and strides) and row_scale [R1, 1] fp32 receives
    input_scale per row (module docstring). Returns y. Callers check shapes and dtypes
    (gdn_export.ops.rms_norm)."""
    if x.dim() == 2:
        x, y, gate, residual, s, yq = (None if t is None else t.unsqueeze(1) for t in (x, y, gate, residual, s, yq))
    R1, H, D = x.shape
    R = R1 * H
    if R == 0:
        return y
    block_r, block_d, num_warps = launch_config(R, D)
    g = x if gate is None else gate
    r, out_s = (x, y) if residual is None else (residual, s)
    rms_norm_kernel[(cdiv(R, block_r),)](
        x, weight, g, y, r, out_s, R, D, H, *x.stride()[:2], *g.stride()[:2], *y.stride()[:2], *r.stride()[:2],
        *out_s.stride()[:2], float(eps), y if yq is None else yq, y if input_scale is None else input_scale,
        y if row_scale is None else row_scale,
        BLOCK_R=block_r, BLOCK_D=block_d, ZERO_CENTERED=bool(zero_centered), GATED=gate is not None,
        RESIDUAL=residual is not None, QUANT=input_scale is not None, SOFT=SOFT_FP8, num_warps=num_warps,
        **pdl_launch(y))
    return y
