"""MoE contract: the cases every implementation is held to, their inputs (tests.ops.moe.inputs
.moe_inputs: router logits whose top 32 never tie in any dtype, so every implementation routes alike),
the oracle (the fp32 reference, itself checked against a float64 per-token loop in
tests/ops/test_moe_reference.py) and the checker (relative RMS per dtype, NaN-poisoned outputs where
an entry takes them). Tags: "small" everywhere, "gpu" (real sizes) on the GPU implementations."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gdn_export.ops.moe.naive import moe as naive_moe
from tests.conftest import RMS_BOUND, fp32_products, rel_rms
from tests.ops.moe.inputs import moe_inputs

ALL = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Case:
    """hidden [N, H], router_logits [N, E], gate_up [E, 2I, H], down [E, H, I]; top_k of E; norm:
    renormalise the top-k probabilities."""

    name: str
    N: int
    H: int
    E: int
    I: int  # noqa: E741
    top_k: int
    norm: bool = True
    dtypes: tuple = ALL
    tags: frozenset = field(default_factory=lambda: frozenset({"small"}))

    @property
    def cost(self) -> int:
        return self.N * self.top_k * self.H * self.I // 1000


def _case(name, N, H, E, I, k, norm=True, tags=("small",)):  # noqa: E741
    return Case(name, N, H, E, I, k, norm, tags=frozenset(tags))


CASES = [
    _case("N1-H16-E4-I16-k1", 1, 16, 4, 16, 1),
    _case("N7-H32-E8-I24-k2-nonorm", 7, 32, 8, 24, 2, norm=False),
    _case("N65-H16-E16-I20-k4", 65, 16, 16, 20, 4),
    _case("N7-H40-E5-I16-k3", 7, 40, 5, 16, 3),
    _case("N5-H8-E3-I4-k3-every-expert", 5, 8, 3, 4, 3),
    # 1200 (token, expert) pairs: the 64-row prefill tiles
    _case("N300-H24-E12-I20-k4-prefill-tiles", 300, 24, 12, 20, 4),
    # real sizes (Qwen3.5-35B-A3B: H 2048, 256 experts of I 512, top 8; Qwen3-Next: 512 experts, top 10)
    _case("N1-H64-E4-I48-k1", 1, 64, 4, 48, 1, tags=("gpu",)),
    _case("N7-H96-E16-I40-k4-nonorm", 7, 96, 16, 40, 4, norm=False, tags=("gpu",)),
    _case("N65-H128-E8-I100-k2", 65, 128, 8, 100, 2, tags=("gpu",)),
    _case("N65-H128-E16-I100-k4-nonorm", 65, 128, 16, 100, 4, norm=False, tags=("gpu",)),
    _case("N130-H256-E64-I96-k8", 130, 256, 64, 96, 8, tags=("gpu",)),
    # ("big": 1.5-6 GiB of expert weights, run a few at a time: tests/conftest.py _gpu_memory_slot)
    _case("decode-B1-qwen35", 1, 2048, 256, 512, 8, tags=("gpu", "big")),
    _case("decode-B8-qwen35", 8, 2048, 256, 512, 8, tags=("gpu", "big")),
    _case("decode-B64-qwen35", 64, 2048, 256, 512, 8, tags=("gpu", "big")),
    _case("prefill-T300-qwen35", 300, 2048, 256, 512, 8, tags=("gpu", "big")),
    _case("prefill-T1000-qwen35", 1000, 2048, 256, 512, 8, tags=("gpu", "big")),
    _case("N33-qwen3next-E512-k10", 33, 2048, 512, 512, 10, tags=("gpu", "big")),
]


def make_inputs(case: Case, dtype: torch.dtype, device: str) -> dict:
    """Fresh inputs drawn on `device`."""
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    hidden, logits, gate_up, down = moe_inputs(case.N, case.H, case.E, case.I, dtype, seed=seed, device=device)
    return dict(hidden=hidden, router_logits=logits, gate_up=gate_up, down=down)


def oracle(case: Case, x: dict) -> torch.Tensor:
    """The fp32 reference (gdn_export.ops.moe.naive, fp32 arithmetic: it widens each routed expert's
    weights) on fp32 hidden / logits, on the inputs' device (the GPU at real sizes: IEEE fp32
    products, TF32 off), returned on the CPU."""
    hidden, logits = x["hidden"].detach().float(), x["router_logits"].detach().float()
    with fp32_products(hidden.device):
        return naive_moe(hidden, logits, x["gate_up"], x["down"], case.top_k, case.norm).cpu()


def check(case: Case, dtype: torch.dtype, out: torch.Tensor, want: torch.Tensor) -> None:
    assert out.dtype == dtype and tuple(out.shape) == (case.N, case.H), (out.dtype, tuple(out.shape))
    err = rel_rms(out.detach().cpu().float(), want)
    assert err <= RMS_BOUND[dtype], f"out: relative RMS {err:.3g} > {RMS_BOUND[dtype]:g} ({dtype})"
