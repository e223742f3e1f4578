"""gdn::attention_at: attention with the mask of positions (the runtime's prefill form), held to the
float64 oracle under the mask `gdn_export.ops.attention.positions.visibility` gives, by every
implementation: the op on a CPU (the mask built, gdn::attention's body), the positional Triton kernel
(interpreted on a CPU), and on a GPU the op by its routes and PyTorch's FlashAttention-2 route.

Cases: rows at their own past (ragged), at 0, at the cache's end; the streaming ring (sinks + window)
before and after it wraps; GQA 1, 4, 8 (and 3); head dims 256, 128, 80, 64, 16; S = 1, 63, 65, 130;
the model's strided q / cache views. Slots no query of a row reads hold NaN keys and inf values for
the kernels (they must never load them).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
import torch

from gdn_export.ops.attention.positions import slot_of, visibility
from tests.ops.attention.cases import HALF, check, oracle
from tests.ops.impl import HAS_CUDA, Impl, params


@dataclass(frozen=True)
class PosCase:
    """q [B, G * Hkv, S, D], cache [B, Hkv, L, D]; pasts: "random" (each row its own, the call
    inside the cache / ring), "zero", "end" (the last S slots), or a tuple; sinks / window: the
    streaming ring (window 0: none; then L = sinks + window). strided: the model's layouts (q a view
    of [B, S, H, D], the cache of [B, L, Hkv, D]). block: the Triton kernel's (BLOCK_M, BLOCK_N)."""

    name: str
    B: int
    G: int
    Hkv: int
    S: int
    L: int
    D: int
    pasts: object = "random"
    sinks: int = 0
    window: int = 0
    strided: bool = False
    block: tuple | None = (16, 16)
    dtypes: tuple = (torch.float32, *HALF)
    tags: frozenset = field(default_factory=lambda: frozenset({"small"}))
    gated: bool = False

    @property
    def H(self) -> int:
        return self.G * self.Hkv

    @property
    def cost(self) -> int:
        return self.B * self.H * self.S * (self.L * self.D // 2 + 100)


def _c(name, B, G, Hkv, S, L, D, tags=("small",), **kw):
    return PosCase(name, B, G, Hkv, S, L, D, tags=frozenset(tags), **kw)


SMALL = [
    _c("S63-B3-G4-Hkv1-D64-ragged", 3, 4, 1, 63, 150, 64),
    _c("S65-B2-G1-Hkv2-D128-zero", 2, 1, 2, 65, 65, 128, pasts="zero"),
    _c("S17-B2-G8-Hkv1-D256-end", 2, 8, 1, 17, 40, 256, pasts="end", dtypes=HALF),
    _c("S130-B1-G3-Hkv1-D80-past-100", 1, 3, 1, 130, 300, 80, pasts=(100,), block=None),
    _c("S1-B3-G2-Hkv2-D16-ragged", 3, 2, 2, 1, 37, 16),
    _c("S33-B2-G2-Hkv2-D32-strided", 2, 2, 2, 33, 70, 32, strided=True),
    _c("S40-B2-G2-Hkv1-D64-default-blocks", 2, 2, 1, 40, 100, 64, block=None),
    # streaming: sinks + ring, rows before the wrap, after several wraps, and with no sinks
    _c("S7-B3-G2-Hkv1-D32-sinks3-window20", 3, 2, 1, 7, 23, 32, pasts=(0, 30, 91), sinks=3, window=20),
    _c("S5-B2-G4-Hkv2-D64-window16", 2, 4, 2, 5, 16, 64, pasts=(3, 40), sinks=0, window=16),
    _c("S16-B2-G1-Hkv2-D16-sinks4-window32-wrap", 2, 1, 2, 16, 36, 16, pasts=(4, 116), sinks=4, window=32),
]

GPU = [
    *[_c(f"S{S}-B{B}-G{G}-D{D}-L{L}-{p}", B, G, 2, S, L, D, ("gpu",), pasts=p, block=None, dtypes=HALF,
         strided=True)
      for B, G, S, L, D, p in ((1, 8, 4096, 8192, 256, "end"), (1, 4, 2048, 6144, 256, "random"),
                               (1, 8, 1000, 4096, 128, "random"), (3, 8, 700, 2048, 256, "random"),
                               (2, 4, 513, 1536, 128, "zero"), (4, 1, 300, 1024, 64, "random"))],
    _c("S300-B2-G8-D256-sinks4-window1020", 2, 8, 2, 300, 1024, 256, ("gpu",), pasts=(0, 4700), sinks=4,
       window=1020, block=None, dtypes=HALF, strided=True),
    _c("S129-B1-G8-D80-L4128", 1, 8, 2, 129, 4128, 80, ("gpu",), block=None, dtypes=HALF),
]

CASES = SMALL + GPU


def _pasts(case: PosCase, gen) -> torch.Tensor:
    if isinstance(case.pasts, tuple):
        return torch.tensor(case.pasts, dtype=torch.int64)
    if case.pasts == "zero":
        return torch.zeros(case.B, dtype=torch.int64)
    if case.pasts == "end":
        return torch.full((case.B,), case.L - case.S, dtype=torch.int64)
    room = case.L - case.S + 1 if not case.window else case.L - case.S + 1
    return torch.randint(0, room, (case.B,), generator=gen)


def make_inputs(case: PosCase, dtype, device, poison_unread=False) -> dict:
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
    B, H, Hkv, S, L, D = case.B, case.H, case.Hkv, case.S, case.L, case.D
    past = _pasts(case, gen)
    assert (slot_of(past, case.sinks, case.window) + S <= L).all(), "a case's call must fit its cache"
    q = (1.5 * torch.randn(B, H, S, D, generator=gen)).to(dtype)
    key = torch.randn(B, Hkv, L, D, generator=gen).to(dtype)
    value = torch.randn(B, Hkv, L, D, generator=gen).to(dtype)
    mask = visibility(past, S, L, case.sinks, case.window)
    x = dict(q=q, key=key, value=value, mask=mask, past=past, scale=D ** -0.5, clean_key=key, clean_value=value)
    if poison_unread:
        unread = ~mask.any(2)[:, :, :, None].expand(B, Hkv, L, D)
        x["key"] = key.masked_fill(unread, float("nan"))
        x["value"] = value.masked_fill(unread, float("inf"))
    x = {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in x.items()}
    if case.strided:
        for n in ("q", "key", "value"):
            x[n] = x[n].transpose(1, 2).contiguous().transpose(1, 2)
    return x


def _args(x, case):
    return x["q"], x["key"], x["value"], x["past"], x["scale"], case.sinks, case.window


def _op(x, case):
    from gdn_export.ops.attention import attention_at

    return attention_at(*_args(x, case))


def _op_cuda(x, case):
    from gdn_export.ops.attention import _attention_at, attention_at

    o = attention_at(*_args(x, case))
    assert torch.equal(_attention_at(*_args(x, case)), o), "the op and its body disagree"
    assert o.stride() == x["q"].stride() or not x["q"].is_contiguous(), "o does not have q's strides"
    return o


def _triton(x, case):
    from kernels.attention.triton.prefill_positions import attention_prefill_positions

    o = attention_prefill_positions(*_args(x, case), block=case.block)
    assert o.stride() == torch.empty_like(x["q"]).stride(), "o does not have empty_like(q)'s strides"
    return o


def _flash(x, case):
    from gdn_export.ops.attention.flash import flash_prefill, takes

    assert takes(x["q"], x["key"], x["value"], case.window), "flash.takes refuses a case the suite gives it"
    return flash_prefill(x["q"], x["key"], x["value"], x["past"], x["scale"])


def _flash_takes(case, dtype):
    """flash.takes on the case's shapes: one row, or several through the paged form where this torch
    has it (block_table) and L is whole pages."""
    from gdn_export.ops.attention import flash

    return (dtype in HALF and not case.window and case.D % 8 == 0
            and (case.B == 1 or (flash.paged() and case.L % flash.PAGE == 0)))


def _flash_missing():
    from gdn_export.ops.attention import flash

    return None if flash.available() else "this torch has no varlen flash attention with seqused_k / block_table"


_HALF_ONLY = lambda case, dtype: dtype in HALF  # noqa: E731
_SMALL = lambda case, dtype: "small" in case.tags  # noqa: E731

IMPLS = [
    Impl("op", "reference", _op, _SMALL),
    Impl("triton-positions", "triton", _triton, lambda case, dtype: dtype in HALF and ("small" in case.tags or HAS_CUDA),
         extra={"skips_unread": True}),
    Impl("op-cuda", "cuda", _op_cuda),
    Impl("flash-cuda", "cuda", _flash, _flash_takes, requires=_flash_missing, extra={"skips_unread": True}),
]


# The kernels take 16-bit inputs: their params come from the cases' 16-bit dtypes (under the
# interpreter one of the two per case, alternating; both on a GPU).
_HALF_CASES = [replace(c, dtypes=tuple(d for d in c.dtypes if d in HALF)) for c in CASES]


@pytest.mark.parametrize("impl,case,dtype",
                         params([i for i in IMPLS if i.kind != "triton"], CASES, None, cost=lambda c: c.cost)
                         + params([i for i in IMPLS if i.kind == "triton"], _HALF_CASES, None, cost=lambda c: c.cost))
def test_attention_at_matches_float64_oracle(impl, case, dtype):
    impl.skip_if_unavailable()
    x = make_inputs(case, dtype, impl.device, poison_unread=impl.extra.get("skips_unread", False))
    check(case, dtype, impl.run(x, case), x, oracle(case, x))


def test_the_step_builds_no_mask_for_a_prefill_outside_export():
    """A prefill call of the model outside export reads positions: the [B, 1, T, L] mask of its
    StepInputs is never built (a 65K-token chunk's would be GiBs)."""
    from gdn_export.layout import DeployLayout
    from gdn_export.modules import kv_cache
    from tests.modules._steps import step as make

    step = make(2, 9, past=[0, 5], layout=DeployLayout.make(cache_len=40))
    assert step._mask is None and step.past_lengths.tolist() == [0, 5]
    assert step.attn_mask.shape == (2, 1, 9, 40)  # built on first use (the export's and decode's form)
    assert torch.equal(step.attn_mask, kv_cache.visibility(step.past_lengths, 9, DeployLayout.make(cache_len=40)))


def test_prefill_routes_on_a_cpu_build_the_mask():
    from gdn_export.ops.attention import prefill_route

    q = torch.zeros(1, 8, 64, 128, dtype=torch.bfloat16)
    kv = torch.zeros(1, 2, 512, 128, dtype=torch.bfloat16)
    assert prefill_route(q, kv, kv, torch.zeros(1, dtype=torch.int64), 0) == "mask"
