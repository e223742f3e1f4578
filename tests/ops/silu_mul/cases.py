"""silu(gate) * up contract: the cases every implementation is held to, their inputs, a float64 oracle
and the checker.

The oracle rounds silu(gate) to the dtype before the product, as the contract does; out must be
within one ulp of the oracle's product rounded to the dtype (relative 2^-10 / 2^-7 in fp16 / bf16
plus the dtype's smallest normal; 1e-6 relative in fp32) and within relative RMS 1e-6 / 5e-4 / 4e-3
(fp32 / fp16 / bf16). Inputs: gate and up as the two halves of one fused [..., 2I] projection
output (strided views, as the MLP makes them) or separate tensors; "model-like" gates spread over
silu's whole range (|gate| up to ~20, where it saturates to 0 and to gate).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tests.ops.elementwise_check import check_elementwise, round_once

ALL = (torch.float32, torch.bfloat16, torch.float16)
REL = {torch.float32: 1e-6, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}
RMS = {torch.float32: 1e-6, torch.float16: 5e-4, torch.bfloat16: 4e-3}


@dataclass(frozen=True)
class Case:
    name: str
    lead: tuple
    I: int
    halves: bool = True
    model_like: bool = True
    dtypes: tuple = ALL
    tags: frozenset = field(default_factory=lambda: frozenset({"small"}))

    @property
    def cost(self) -> int:
        n = self.I
        for d in self.lead:
            n *= d
        return n


def _case(name, lead, I, tags=("small",), **kw):
    return Case(name, tuple(lead), I, tags=frozenset(tags), **kw)


CASES = [
    _case("decode-I512-halves", (1, 1), 512),
    _case("decode-B3-I300-halves", (3, 1), 300),
    _case("prefill-B2-T33-I256-halves", (2, 33), 256),
    _case("separate-T17-I96", (1, 17), 96, halves=False),
    _case("odd-I1", (5,), 1),
    _case("odd-I7-normal", (3, 11), 7, model_like=False),
    _case("wide-I3000-halves", (2,), 3000),
    _case("no-rows", (0, 3), 64),
    _case("prefill-T4096-I6144-halves", (1, 4096), 6144, tags=("gpu",)),
]


def make_inputs(case: Case, dtype: torch.dtype, device: str, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    spread = 6.0 if case.model_like else 1.0
    if case.halves:
        both = torch.randn(*case.lead, 2 * case.I, generator=g) * spread
        both = both.to(dtype).to(device)
        return {"gate": both[..., : case.I], "up": both[..., case.I:]}
    gate = (torch.randn(*case.lead, case.I, generator=g) * spread).to(dtype).to(device)
    up = torch.randn(*case.lead, case.I, generator=g).to(dtype).to(device)
    return {"gate": gate, "up": up}


def oracle(inp: dict) -> torch.Tensor:
    """float64 on the CPU: silu(gate) rounded to the dtype (once: round_once), times up."""
    gate, up = inp["gate"], inp["up"]
    g = gate.double().cpu()
    act = round_once(g * torch.sigmoid(g), gate.dtype)
    return act * up.double().cpu()


def check(out: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, shape: tuple) -> None:
    """out against the float64 oracle, at the bounds in the module docstring."""
    check_elementwise(out, want, dtype, shape, REL[dtype], RMS[dtype])
