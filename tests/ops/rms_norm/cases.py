"""RMSNorm contract: the cases every implementation is held to, their inputs, a float64 oracle and the
checker.

y [..., D] must match the float64 oracle rounded to x's dtype: in fp32 within relative RMS 1e-6 and
1e-5 per element, in fp16 / bf16 every element within one ulp of its dtype (relative 2^-10 / 2^-7 of the oracle, the
absolute floor of the dtype's smallest normal) and relative RMS 5e-4 / 4e-3. Inputs are
"model-like" (a few outlier channels 30x the rest, as residual streams have; weights around 0 for a
zero-centred norm, around 1 otherwise; gates over silu's curved range) or plain normal draws; x and
gate come as strided views where the models make them (q / gate interleaved per head, z split from
one projection).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tests.ops.elementwise_check import check_elementwise

ALL = (torch.float32, torch.bfloat16, torch.float16)
REL = {torch.float32: 1e-5, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}
RMS = {torch.float32: 1e-6, torch.float16: 5e-4, torch.bfloat16: 4e-3}


@dataclass(frozen=True)
class Case:
    """x [*lead, D]; kind "plain" | "zero" (zero-centred) | "gated"; view: "contiguous", "interleaved"
    (x is the first half of [*lead, 2D], as q beside its output gate), "split" (x and gate are slices
    of one [*lead, 3D] tensor, as z beside q / k)."""

    name: str
    lead: tuple
    D: int
    kind: str = "plain"
    view: str = "contiguous"
    eps: float = 1e-6
    model_like: bool = True
    dtypes: tuple = ALL
    tags: frozenset = field(default_factory=lambda: frozenset({"small"}))

    @property
    def rows(self) -> int:
        n = 1
        for d in self.lead:
            n *= d
        return n

    @property
    def cost(self) -> int:
        return self.rows * self.D


def _case(name, lead, D, tags=("small",), **kw):
    return Case(name, tuple(lead), D, tags=frozenset(tags), **kw)


CASES = [
    _case("decode-hidden2048-zero", (1, 1), 2048, kind="zero"),
    _case("decode-B3-hidden2048-plain", (3, 1), 2048),
    _case("prefill-B2-T33-hidden256-zero", (2, 33), 256, kind="zero"),
    _case("q-norm-interleaved-H3-D256-zero", (2, 5, 3), 256, kind="zero", view="interleaved"),
    _case("k-norm-H2-D128-zero", (1, 7, 2), 128, kind="zero"),
    _case("gdn-gated-Hv4-Dv128-split", (2, 3, 4), 128, kind="gated", view="split"),
    _case("gdn-gated-Hv6-Dv48", (1, 9, 6), 48, kind="gated", eps=1e-5),
    _case("odd-D1", (5,), 1),
    _case("odd-D7-gated", (3, 11), 7, kind="gated"),
    _case("odd-D130-zero-interleaved", (4, 3), 130, kind="zero", view="interleaved"),
    _case("R300-D40-normal", (300,), 40, model_like=False),
    _case("wide-D5120-zero", (2,), 5120, kind="zero"),
    _case("wide-D16384", (1,), 16384, model_like=False),
    _case("no-rows", (0, 4), 64, kind="gated"),
    _case("prefill-T4096-hidden2048", (1, 4096), 2048, kind="zero", tags=("gpu",)),
    _case("prefill-T4096-gated-Hv16-Dv128", (1, 4096, 16), 128, kind="gated", view="split", tags=("gpu",)),
]


def make_inputs(case: Case, dtype: torch.dtype, device: str, seed: int = 0) -> dict:
    """{"x", "weight", "gate"(or None), "eps", "zero_centered"} for the case, on `device`."""
    g = torch.Generator().manual_seed(seed)
    D, lead = case.D, case.lead
    width = {"contiguous": 1, "interleaved": 2, "split": 3}[case.view]
    base = torch.randn(*lead, width * D, generator=g)
    if case.model_like:
        base[..., : width * D : max(1, D // 3)] *= 30.0  # outlier channels
    gate = None
    if case.kind == "gated":
        gate_full = torch.randn(*lead, width * D, generator=g) * 3.0
        gate = gate_full.to(dtype).to(device)
        gate = gate[..., D : 2 * D] if case.view == "split" else gate[..., :D]
    full = base.to(dtype).to(device)
    x = full[..., :D]
    if case.kind == "zero":
        weight = torch.randn(D, generator=g) * (0.3 if case.model_like else 1.0)
    else:
        weight = 1.0 + torch.randn(D, generator=g) * (0.1 if case.model_like else 1.0)
    return {"x": x, "weight": weight.to(dtype).to(device), "gate": gate, "eps": case.eps,
            "zero_centered": case.kind == "zero"}


def oracle(inp: dict) -> torch.Tensor:
    """y in float64 on the CPU."""
    x = inp["x"].double().cpu()
    w = inp["weight"].double().cpu()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + inp["eps"])
    y = y * ((1.0 + w) if inp["zero_centered"] else w)
    if inp["gate"] is not None:
        z = inp["gate"].double().cpu()
        y = y * z * torch.sigmoid(z)
    return y


def check(y: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, shape: tuple) -> None:
    """y (x's dtype, x's shape) against the float64 oracle, at the bounds in the module docstring."""
    check_elementwise(y, want, dtype, shape, REL[dtype], RMS[dtype])
