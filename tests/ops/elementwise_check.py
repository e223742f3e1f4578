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
