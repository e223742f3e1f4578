"""RMSNorm in one kernel: plain, zero-centred and gated (the three norms of the hybrid families), and the
decoder's residual add before a plain or zero-centred norm.

    x       [R, D]  fp32 / fp16 / bf16, unit stride along D, any row stride
    res     [R, D]  x's dtype (residual add only), unit stride along D, any row stride
    s       [R, D]  x's dtype (residual add only): x + res in fp32, rounded once to x's dtype (PyTorch's
            add); the norm below then reads s in place of x
    weight  [D]     any float dtype, unit stride
    gate    [R, D]  x's dtype (gated only), unit stride along D, any row stride
    y       [R, D]  x's dtype, unit stride along D, any row stride:
            y = x * rsqrt(mean(x^2) + eps) * w * silu(gate), all in fp32, rounded once to y's dtype;
            w = 1 + weight (zero-centred) or weight; the silu factor only when gated

One program normalises BLOCK_R rows of BLOCK_D >= D columns held in registers: a 4096-token prefill
norm of [4096, 2048] bf16 reads 16 MiB and writes 16 MiB once, where the unfused PyTorch form (cast,
square, mean, rsqrt, two products, cast back) makes ~8 passes over an fp32 copy and launches ~8
kernels (a decode step's norm is launch-bound: one launch instead of ~8).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_utils import cdiv, next_pow2, pdl_enter, pdl_launch

# Widest row held in registers (hidden sizes of the families: 2048 .. 8192).
MAX_D = 16384
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Elements one program holds: rows per program = TILE // BLOCK_D (at least 1).
TILE = 4096


@triton.jit
def rms_norm_kernel(x, w, g, y, res, s, R, D, stride_x, stride_g, stride_y, stride_res, stride_s, eps,
                    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, ZERO_CENTERED: tl.constexpr,
                    GATED: tl.constexpr, RESIDUAL: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_enter(USE_PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    ok = (rows < R)[:, None] & col_ok[None, :]
    r64 = rows.to(tl.int64)[:, None]
    b_x = tl.load(x + r64 * stride_x + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    if RESIDUAL:
        b_r = tl.load(res + r64 * stride_res + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        b_s = (b_x + b_r).to(s.dtype.element_ty)
        tl.store(s + r64 * stride_s + cols[None, :], b_s, mask=ok)
        b_x = b_s.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(b_x * b_x, 1) / D + eps)
    b_w = tl.load(w + cols, mask=col_ok, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        b_w = b_w + 1.0
    out = b_x * rstd[:, None] * b_w[None, :]
    if GATED:
        b_g = tl.load(g + r64 * stride_g + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        out = out * (b_g * tl.sigmoid(b_g))
    tl.store(y + r64 * stride_y + cols[None, :], out.to(y.dtype.element_ty), mask=ok)


def launch_config(R: int, D: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_D, num_warps) for R rows of D columns."""
    block_d = max(16, next_pow2(D))
    block_r = max(1, min(TILE // block_d, next_pow2(R)))
    return block_r, block_d, min(8, max(1, block_r * block_d // 1024))


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool,
                  gate: torch.Tensor | None, y: torch.Tensor, residual: torch.Tensor | None = None,
                  s: torch.Tensor | None = None) -> torch.Tensor:
    """Launch over x [R, D] (unit stride along D), weight [D], gate [R, D] or None, into y [R, D];
    with `residual` [R, D] (no gate) the sum x + residual is written to s [R, D] and normalised.
    Returns y. Callers check shapes and dtypes (gdn_export.ops.rms_norm)."""
    R, D = x.shape
    if R == 0:
        return y
    block_r, block_d, num_warps = launch_config(R, D)
    g = x if gate is None else gate
    r, out_s = (x, y) if residual is None else (residual, s)
    rms_norm_kernel[(cdiv(R, block_r),)](
        x, weight, g, y, r, out_s, R, D, x.stride(0), g.stride(0), y.stride(0), r.stride(0), out_s.stride(0),
        float(eps), BLOCK_R=block_r, BLOCK_D=block_d, ZERO_CENTERED=bool(zero_centered), GATED=gate is not None,
        RESIDUAL=residual is not None, num_warps=num_warps, **pdl_launch(y))
    return y
