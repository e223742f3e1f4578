"""Causal conv1d contract: the cases every implementation is held to, their inputs, a float64 oracle
and the checker.

y [B, T, C] must match the float64 conv (relative RMS per dtype); new_conv_state [B, C, K-1] is a copy
of inputs (the last K-1 of old state and x), so it must be bit-identical in every dtype. Ragged rows
(seq_lens, tests.ragged.CONV_RAGGED) must equal each row run alone, padded positions finite.

Tags as in tests/ops/gated_delta_rule/cases.py: "small" everywhere, "gpu" on GPU implementations
only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gdn_export.ops.causal_conv1d.naive import causal_conv1d as naive_conv
from tests.conftest import RMS_BOUND, rel_rms
from tests.ragged import CONV_RAGGED, check_conv_rows, conv_ragged_inputs

ALL = (torch.float32, torch.bfloat16, torch.float16)
REFERENCE_BOUND = 1e-5


@dataclass(frozen=True)
class Case:
    """B, T, C, K: x [B, T, C], weight [C, K]. lengths: per-row seq_lens (ragged) or None."""

    name: str
    B: int
    T: int
    C: int
    K: int
    bias: bool = True
    state: bool = True
    silu: bool = True
    lengths: tuple | None = None
    dtypes: tuple = ALL
    tags: frozenset = field(default_factory=lambda: frozenset({"small"}))

    @property
    def cost(self) -> int:
        return self.B * self.T * self.C * self.K


def _case(name, B, T, C, K, tags=("small",), **kw):
    return Case(name, B, T, C, K, tags=frozenset(tags), **kw)


SMALL = [
    _case("decode-T1-C64-K4", 1, 1, 64, 4),
    _case("decode-B3-C300-K4-linear", 3, 1, 300, 4, silu=False),
    _case("T2-shorter-than-state-B3-C40-K4", 3, 2, 40, 4),
    _case("T2-shorter-than-state-C4-K2", 2, 2, 4, 2),
    _case("T17-B3-C5-K3-linear", 3, 17, 5, 3, silu=False),
    _case("T65-C130-K3-no-bias", 2, 65, 130, 3, bias=False),
    _case("T130-C16-K4-no-state", 1, 130, 16, 4, state=False),
    _case("T7-C8-K1-linear-no-state", 2, 7, 8, 1, state=False, silu=False),
    *[_case(f"ragged-{name}-C37-K{K}", len(lens), T, 37, K, lengths=tuple(lens))
      for name, (T, lens) in CONV_RAGGED.items() for K in (2, 3, 4)],
    _case("ragged-T3-no-state-C5-K4", 3, 3, 5, 4, state=False, lengths=(3, 0, 1)),
]

GPU = [
    # B x C x K crossed once (they index the grid independently), every T
    *[_case(f"T{T}-{'B1-C64-K2' if one else 'B3-C200-K4'}", 1 if one else 3, T, 64 if one else 200, 2 if one else 4,
            ("gpu",)) for T in (1, 2, 3, 63, 64, 65, 1000) for one in (True, False)],
    *[_case(f"T{T}-C96-K4-{'state' if st else 'no-state'}-{'bias' if b else 'no-bias'}-{'silu' if s else 'linear'}",
            2, T, 96, 4, ("gpu",), state=st, bias=b, silu=s)
      for T in (1, 100) for st in (True, False) for b in (True, False) for s in (True, False)],
    *[_case(f"T{T}-B3-C130-K{K}", 3, T, 130, K, ("gpu",)) for T in (1, 2, 5, 300) for K in (1, 3, 8)],
    *[_case(f"ragged-{name}-C203-K{K}", len(lens), T, 203, K, ("gpu",), lengths=tuple(lens))
      for name, (T, lens) in CONV_RAGGED.items() for K in (2, 3, 4)],
    # a model's channel count (2 x 1024 + 64): several channel blocks
    *[_case(f"T{T}-B3-C2112-K4", 3, T, 2112, 4, ("gpu",)) for T in (1, 4097)],
]

CASES = SMALL + GPU


def make_inputs(case: Case, dtype: torch.dtype, device: str) -> dict:
    """Fresh random x, weight, bias, conv_state (None where the case has none) and seq_lens (int32 or
    None) in `dtype` on `device`; ragged rows hold large values at padded positions."""
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    if case.lengths is not None:
        x, w, b, s0, lens = conv_ragged_inputs(list(case.lengths), case.T, case.C, case.K, dtype, device,
                                               bias=case.bias, state=case.state, seed=seed)
        return dict(x=x, weight=w, bias=b, conv_state=s0, seq_lens=lens)
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *shape, s=1.0: (s * torch.randn(*shape, generator=gen)).to(device=device, dtype=dtype)  # noqa: E731
    return dict(x=rnd(case.B, case.T, case.C), weight=rnd(case.C, case.K, s=0.5),
                bias=rnd(case.C, s=0.1) if case.bias else None,
                conv_state=rnd(case.B, case.C, case.K - 1) if case.state else None, seq_lens=None)


def oracle(case: Case, x: dict):
    """(y, new_conv_state) of the float64 reference on CPU (call before an in-place implementation)."""
    d = {n: (None if t is None else t.detach().cpu()) for n, t in x.items()}
    f64 = lambda t: None if t is None else t.double()  # noqa: E731
    y, s = naive_conv(f64(d["x"]), f64(d["weight"]), f64(d["bias"]), f64(d["conv_state"]), case.silu)
    return y, s, d


def check(case: Case, dtype: torch.dtype, y: torch.Tensor, new_state: torch.Tensor, want, tight: bool = False):
    """y within RMS_BOUND[dtype] of the float64 conv (REFERENCE_BOUND for an fp32 reference), the new
    state bit-identical to its inputs' copy; ragged rows against each row alone (tests.ragged)."""
    want_y, want_s, d = want
    assert y.dtype == dtype and tuple(y.shape) == (case.B, case.T, case.C), (y.dtype, tuple(y.shape))
    assert new_state.dtype == dtype and tuple(new_state.shape) == (case.B, case.C, case.K - 1), \
        (new_state.dtype, tuple(new_state.shape))
    y, new_state = y.detach().cpu(), new_state.detach().cpu()
    if case.lengths is not None:
        check_conv_rows(y, new_state, d["x"], d["weight"], d["bias"], d["conv_state"], d["seq_lens"], case.silu,
                        dtype, exact=tight and dtype == torch.float32)
        return
    bound = REFERENCE_BOUND if tight and dtype == torch.float32 else RMS_BOUND[dtype]
    err = rel_rms(y, want_y)
    assert err <= bound, f"y: relative RMS {err:.3g} > {bound:g} ({dtype})"
    if case.K > 1:
        assert torch.equal(new_state, want_s.to(dtype)), "new_conv_state is not the copy of the last K-1 inputs"
