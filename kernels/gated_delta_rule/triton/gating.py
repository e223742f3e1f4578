"""The Gated DeltaNet layer's gates in one kernel, padded tokens masked.

    a, b            [R, Hv]  one float dtype, unit stride along Hv, any row stride (R = B * T tokens;
                             slices of the fused input projection's output are such views)
    A_log, dt_bias  [Hv]     any float dtype
    real            [R]      bool (or uint8): true for a real token, false for a ragged row's padding
    g               [R, Hv]  fp32:   -exp(A_log) * softplus(a + dt_bias), 0 where padded
    beta            [R, Hv]  b's dtype: round(sigmoid(b)) * beta_scale, 0 where padded
    softplus(x) = x above 20, else log1p(exp(x)) (PyTorch's threshold); fp32 math throughout; beta's
    sigmoid rounded to b's dtype before the scale, as torch.sigmoid(b) * beta_scale rounds it.

A decode step's gating is ~9 launches of [B, 1, Hv] elementwise kernels per GDN layer in PyTorch's
form (exp, neg, add, softplus, mul, sigmoid, two where, their scalar fills); here it is one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_utils import cdiv, next_pow2, pdl_enter, pdl_launch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TILE = 1024  # elements a program holds


@triton.jit
def _log1p(e):
    """log(1 + e) for e >= 0, accurate where 1 + e rounds near 1 (Goldberg's correction)."""
    u = 1.0 + e
    one = u == 1.0
    return tl.where(one, e, tl.log(u) * (e / tl.where(one, 1.0, u - 1.0)))


@triton.jit
def gdn_gating_kernel(a, b, A_log, dt_bias, real, g, beta, R, H, stride_a, stride_b, beta_scale,
                      BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_enter(USE_PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    heads = tl.arange(0, BLOCK_H)
    head_ok = heads < H
    row_ok = rows < R
    ok = row_ok[:, None] & head_ok[None, :]
    r64 = rows.to(tl.int64)[:, None]
    keep = (tl.load(real + rows, mask=row_ok, other=0) != 0)[:, None]
    b_a = tl.load(a + r64 * stride_a + heads[None, :], mask=ok, other=0.0).to(tl.float32)
    b_b = tl.load(b + r64 * stride_b + heads[None, :], mask=ok, other=0.0).to(tl.float32)
    a_log = tl.load(A_log + heads, mask=head_ok, other=0.0).to(tl.float32)
    bias = tl.load(dt_bias + heads, mask=head_ok, other=0.0).to(tl.float32)
    x = b_a + bias[None, :]
    softplus = tl.where(x > 20.0, x, _log1p(tl.exp(tl.minimum(x, 20.0))))
    b_g = -tl.exp(a_log)[None, :] * softplus
    dtype = beta.dtype.element_ty
    b_beta = (1.0 / (1.0 + tl.exp(-b_b))).to(dtype).to(tl.float32) * beta_scale
    out = r64 * H + heads[None, :]
    tl.store(g + out, tl.where(keep, b_g, 0.0), mask=ok)
    tl.store(beta + out, tl.where(keep, b_beta, 0.0).to(dtype), mask=ok)


def launch_config(R: int, H: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_H, num_warps) for R tokens of H heads."""
    block_h = max(2, next_pow2(H))
    block_r = max(1, min(max(1, TILE // block_h), next_pow2(R)))
    return block_r, block_h, 1 if block_r * block_h <= 256 else 4


def gdn_gating_rows(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                    real: torch.Tensor, beta_scale: float, g: torch.Tensor, beta: torch.Tensor):
    """Launch over a, b [R, H] (unit stride along H), real [R] bool or uint8, into contiguous g [R, H] fp32 and
    beta [R, H] in b's dtype; returns (g, beta). Callers check shapes and dtypes
    (gdn_export.ops.gated_delta_rule.gating)."""
    R, H = a.shape
    if R == 0 or H == 0:
        return g, beta
    block_r, block_h, num_warps = launch_config(R, H)
    gdn_gating_kernel[(cdiv(R, block_r),)](
        a, b, A_log, dt_bias, real, g, beta, R, H, a.stride(0), b.stride(0), float(beta_scale),
        BLOCK_R=block_r, BLOCK_H=block_h, num_warps=num_warps, **pdl_launch(g))
    return g, beta
