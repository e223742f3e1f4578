"""The check the elementwise ops' contract suites share (rms_norm, silu_mul): an output against its
float64 oracle, per element within a relative bound and over the whole within a relative RMS."""

from __future__ import annotations

import torch


def check_elementwise(out: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, shape: tuple, rel: float,
                      rms: float) -> None:
    """out (dtype, shape) against want (float64, CPU): no NaN (a poisoned element left unwritten), every
    element within rel x |want| + the dtype's smallest normal, relative RMS <= rms."""
    assert out.dtype == dtype and tuple(out.shape) == tuple(shape), f"out {out.dtype} {tuple(out.shape)}"
    got = out.double().cpu()
    assert not torch.isnan(got).any(), "NaN in the output (an element left unwritten?)"
    if want.numel() == 0:
        return
    err = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
    assert err <= rms, f"relative RMS {err:.3g} > {rms:g} ({dtype})"
    bound = want.abs() * rel + torch.finfo(dtype).tiny
    worst = ((got - want).abs() / bound).max().item()
    assert worst <= 1.0, f"an element is {worst:.2f} x its bound from the oracle ({dtype})"


def round_once(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 x rounded to dtype once, to nearest even, as float64. torch's float64 -> fp16 / bf16
    cast goes through fp32 and can round twice: -0.16766356893 (silu(-2.724609375)) lies just inside
    the fp16 midpoint -0.16766357421875, which fp32 holds, so the two casts give -0.1677246 where the
    nearest fp16 is -0.1676025. Here fp32 rounds to odd (truncated, last bit set when inexact; 24 bits
    >= the 16-bit significand + 2), which leaves the second rounding the only one."""
    if dtype in (torch.float64, torch.float32):
        return x.to(dtype).double()
    f = x.float()
    toward_zero = torch.where(f.double().abs() > x.abs(), torch.nextafter(f, torch.zeros_like(f)), f)
    bits = toward_zero.view(torch.int32)
    odd = torch.where(f.double() != x, bits | 1, bits).view(torch.float32)
    return odd.to(dtype).double()
