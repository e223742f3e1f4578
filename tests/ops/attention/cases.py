"""Attention and K/V-cache-write contract: the cases every implementation is held to, their inputs,
the float64 oracles and the checkers (gdn_export.ops.attention: gdn::attention, gdn::kv_cache_update,
gdn::write_kv_cache_).

Attention: o [B, H, S, D] = softmax(scale q key^T, masked) value over a cache key / value
[B, Hkv, L, D], query head h reading kv head h // G (G = H / Hkv), mask [B, 1, S, L] bool (or
broadcast to it). A query row that may read nothing gives zeros. A case is a shape plus what makes
it hard: S = 1 (decode), 63, 65, 130; G = 1, 3, 4, 8; D = 64, 128, 80 (the Triton decode kernel
takes powers of two only), masks as the model makes them (each batch row its own past: ragged;
positions near the cache's end; a short context in a long cache; a sliding window; holes of evicted
slots; padded rows whose queries read nothing), masks that arrive broadcast (stride 0), q and the
cache as the model's strided views, and the gated output o * sigmoid(gate) the gated-attention
layer makes of it. Slots no query of a row may read hold NaN keys and inf values for the
implementations that promise not to read them (the Triton kernels: `Impl.extra["skips_unread"]`).

K/V write: key_cache / value_cache [B, Hkv, L, D] get key / value [B, Hkv, S, D] at slots
write_indices[b] + s; every other slot keeps its (random) value. A copy: the result must equal a
Python loop's exactly, in every dtype (an update in another dtype than the cache is rounded on store).

Tolerances (relative RMS against the float64 oracle, per activation dtype) are BOUND below, the one
place they are stated. Tags say where a case runs: "small" on every implementation (references,
ONNX Runtime, Triton under its interpreter on a CPU), "gpu" (the model's sizes) on the GPU ones,
"sdpa" also on the op's SDPA route run on a CPU (fp32; every small case on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tests.conftest import rel_rms

ALL = (torch.float32, torch.bfloat16, torch.float16)
HALF = (torch.bfloat16, torch.float16)
# Relative RMS of o against float64 per activation dtype. fp32: every implementation keeps scores,
# softmax and P V in fp32. fp16 / bf16: q, key, value are exact in the oracle (it takes the rounded
# inputs), the kernels round P to the 16-bit dtype before P V (as flash attention does) and the
# output once: measured 2-3e-3 in bf16 (8-bit mantissa), 3e-4 in fp16 (11 bits).
BOUND = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1e-2}
WINDOW = 20  # slots a query of the "window" masks sees, its own included
MASKS = ("causal", "near-end", "past0", "decode-lengths", "short-in-long", "window", "holes", "padded", "all")


@dataclass(frozen=True)
class Case:
    """One attention input class.

    B, G, Hkv, S, L, D: q [B, G * Hkv, S, D], key / value [B, Hkv, L, D]. mask: how each row's
    queries read the cache (MASKS; see make_mask). mask_shape: the mask as it arrives ("B-1-S-L"
    whole, or broadcast "1-1-S-L", "B-1-1-L", "1-1-1-L"). strided: q a [B, H, S, D] view of
    [B, S, H, D] and key / value views of a [B, L, Hkv, D] cache (the model's layouts), and the
    decode kernel's output a view with gaps. empty_rows: batch row 0 and query 1 of row 1 read
    nothing. gated: the layer's o * sigmoid(gate) is checked too. block: the Triton prefill
    kernel's (BLOCK_M, BLOCK_N) (small blocks: many query blocks and tiles at CPU sizes), None for
    its default. splits: the decode kernel's (n_splits, block_n), None for its plan.
    """

    name: str
    B: int
    G: int
    Hkv: int
    S: int
    L: int
    D: int
    mask: str = "causal"
    mask_shape: str = "B-1-S-L"
    strided: bool = False
    empty_rows: bool = False
    gated: bool = False
    block: tuple | None = (16, 16)
    splits: tuple | None = None
    dtypes: tuple = ALL
    tags: frozenset = field(default_factory=lambda: frozenset({"small"}))

    @property
    def H(self) -> int:
        return self.G * self.Hkv

    @property
    def cost(self) -> int:
        """What an interpreted kernel's run time grows with (over ~0.3 s a launch): score elements
        times head dim, and each query row's tiles, scaled so that the cases under
        tests.ops.impl.INTERPRETED_CHEAP (2000) take about 0.5 s on a 2-core CPU."""
        return self.B * self.H * self.S * (self.L * self.D // 2 + 100)


def _case(name, B, G, Hkv, S, L, D, tags=("small",), **kw):
    return Case(name, B, G, Hkv, S, L, D, tags=frozenset(tags), **kw)


BF16_ONLY, FP16_ONLY = (torch.bfloat16,), (torch.float16,)

SMALL = [
    # the decode kernel's grid: every (G, S) pair with D, L, B and the dtype rotating (L = 1: a row of
    # one visible slot), then every D at the model's G = 8, S = 1
    *[_case(f"decode-G{G}-S{S}-D{D}-L{L}-B{B}-Hkv{Hkv}", B, G, Hkv, S, L, D, mask="decode-lengths", dtypes=dt)
      for G, S, D, L, B, Hkv, dt in (
          (1, 1, 64, 300, 3, 2, BF16_ONLY), (1, 2, 128, 37, 1, 2, FP16_ONLY), (1, 3, 256, 5, 3, 2, BF16_ONLY),
          (2, 1, 128, 5, 3, 2, FP16_ONLY), (2, 2, 256, 300, 3, 2, BF16_ONLY), (2, 3, 64, 1, 3, 2, FP16_ONLY),
          (8, 1, 256, 37, 3, 2, FP16_ONLY), (8, 2, 64, 300, 1, 2, BF16_ONLY), (8, 1, 128, 300, 3, 2, BF16_ONLY),
          (8, 1, 256, 300, 1, 2, FP16_ONLY), (8, 3, 256, 37, 1, 2, BF16_ONLY))],
    # the SDPA route's shapes (fp32: what it computes on a CPU), causal over a ragged past and with holes
    *[_case(f"sdpa-{name}-{kind}", B, H // Hkv, Hkv, S, L, D, ("small", "sdpa"), mask=kind, dtypes=(torch.float32,))
      for name, (B, H, Hkv, S, L, D) in {"gqa8": (2, 16, 2, 33, 70, 32), "mha": (3, 4, 4, 5, 9, 16),
                                          "gqa3-one-query": (1, 6, 2, 1, 40, 64),
                                          "mqa-full-cache": (2, 3, 1, 17, 17, 8)}.items()
      for kind in ("causal", "holes")],
    # decode steps (S = 1): ragged rows, positions near the end, every group size, D 64 / 128 / 80
    _case("decode-B3-G4-D64-ragged", 3, 4, 2, 1, 37, 64, ("small", "sdpa"), mask="decode-lengths"),
    _case("decode-B2-G3-D128-near-end", 2, 3, 1, 1, 65, 128, ("small", "sdpa"), mask="near-end"),
    _case("decode-B3-G1-D80-ragged", 3, 1, 2, 1, 40, 80, mask="decode-lengths"),
    _case("decode-B1-G8-Hkv1-D64-full", 1, 8, 1, 1, 37, 64, mask="decode-lengths"),
    _case("decode-B3-G8-D256-L300-ragged", 3, 8, 2, 1, 300, 256, mask="decode-lengths"),
    _case("decode-B2-G4-D64-gated", 2, 4, 2, 1, 37, 64, ("small", "sdpa"), mask="decode-lengths", gated=True),
    _case("decode-B3-G1-D16-L5", 3, 1, 2, 1, 5, 16, mask="decode-lengths", dtypes=HALF),
    # a few query rows against the cache (speculative / multi-token decode)
    _case("S2-B3-G2-D128-L37-ragged", 3, 2, 2, 2, 37, 128, mask="decode-lengths"),
    _case("S3-B3-G8-D128-L37-ragged", 3, 8, 2, 3, 37, 128, mask="decode-lengths", dtypes=HALF),
    _case("S2-B3-G2-D64-empty-rows", 3, 2, 2, 2, 37, 64, ("small", "sdpa"), mask="decode-lengths", empty_rows=True),
    # decode splits of one 16-slot block, most of them past a short row's visible slots
    _case("decode-B3-G8-D64-L300-19-splits", 3, 8, 2, 1, 300, 64, mask="decode-lengths", splits=(19, 16),
          dtypes=HALF),
    # prefill: T = 63, 65, 130 against ragged pasts and the other masks the model makes (the Triton
    # kernel in its own blocks for the new lengths, 16 x 16 for many tiles at small sizes elsewhere)
    _case("S63-B2-G3-Hkv1-D64-causal", 2, 3, 1, 63, 100, 64, ("small", "sdpa"), block=None),
    _case("S63-B2-G3-Hkv1-D16-causal", 2, 3, 1, 63, 100, 16),
    _case("S65-B2-G4-D128-near-end", 2, 4, 1, 65, 80, 128, ("small", "sdpa"), mask="near-end", block=None),
    _case("S130-B1-G1-Hkv2-D80-past0", 1, 1, 2, 130, 130, 80, mask="past0", block=None),
    _case("S17-B3-G2-D32-causal", 3, 2, 2, 17, 63, 32),
    _case("S5-B1-G2-Hkv1-D16-L8-causal", 1, 2, 1, 5, 8, 16),
    _case("S100-B2-G1-D64-causal-default-blocks", 2, 1, 2, 100, 100, 64, block=None),
    _case("S33-B1-G8-Hkv1-D64-causal-32x16", 1, 8, 1, 33, 40, 64, block=(32, 16)),
    _case("S63-B2-G2-D32-past0", 2, 2, 2, 63, 63, 32, mask="past0"),
    _case("S100-B1-G1-Hkv3-D16-past0-16x32", 1, 1, 3, 100, 100, 16, ("small", "sdpa"), mask="past0", block=(16, 32)),
    _case("S17-B2-G2-Hkv1-D32-short-in-long", 2, 2, 1, 17, 300, 32, mask="short-in-long"),
    _case("S1-B1-G8-D64-short-in-long", 1, 8, 2, 1, 300, 64, mask="short-in-long"),
    _case("S63-B2-G2-D32-window", 2, 2, 2, 63, 100, 32, mask="window"),
    _case("S100-B1-G3-Hkv1-D24-window-32x16", 1, 3, 1, 100, 100, 24, mask="window", block=(32, 16)),
    _case("S17-B2-G8-Hkv1-D16-holes", 2, 8, 1, 17, 63, 16, ("small", "sdpa"), mask="holes"),
    _case("S63-B2-G1-D40-holes", 2, 1, 2, 63, 100, 40, mask="holes"),
    _case("S33-B3-G2-Hkv1-D32-padded", 3, 2, 1, 33, 63, 32, ("small", "sdpa"), mask="padded"),
    _case("S17-B2-G3-D64-padded-default-blocks", 2, 3, 2, 17, 17, 64, mask="padded", block=None),
    _case("S65-B2-G4-D64-gated", 2, 4, 2, 65, 70, 64, gated=True, block=None),
    # masks that arrive broadcast (stride 0), rows that read nothing, the model's strided views
    *[_case(f"S33-B3-G2-D32-{kind}-mask-{shape}", 3, 2, 2, 33, 70, 32, mask=kind, mask_shape=shape)
      for kind, shape in (("causal", "1-1-S-L"), ("holes", "B-1-1-L"), ("window", "1-1-1-L"))],
    *[_case(f"S2-B3-G2-D64-decode-mask-{shape}", 3, 2, 2, 2, 37, 64, mask="decode-lengths", mask_shape=shape)
      for shape in ("1-1-S-L", "B-1-1-L")],
    _case("S33-B3-G2-D32-empty-rows", 3, 2, 2, 33, 70, 32, empty_rows=True),
    _case("S33-B2-G2-D32-strided", 2, 2, 2, 33, 63, 32, ("small", "sdpa"), strided=True),
    _case("S2-B3-G2-D64-strided", 3, 2, 2, 2, 37, 64, mask="decode-lengths", strided=True),
]

# The model's sizes (the 1.66B model: H 16, Hkv 2, D 256, a 4128-slot cache; Qwen3.5: D 128 / 256):
# the GPU implementations only.
GPU = [
    *[_case(f"decode-B{B}-G{G}-S{S}-D256-L4128", B, G, 2, S, 4128, 256, ("gpu",), mask="decode-lengths",
            block=None, dtypes=HALF)
      for G, S in ((8, 1), (8, 3), (1, 1), (2, 2)) for B in (1, 3)],
    *[_case(f"decode-B3-G8-D{D}-L4128", 3, 8, 2, 1, 4128, D, ("gpu",), mask="decode-lengths", block=None,
            dtypes=(torch.bfloat16,)) for D in (16, 32, 64, 128)],
    _case("decode-B2-G8-D256-L4099-causal", 2, 8, 2, 1, 4099, 256, ("gpu",), block=None),
    _case("decode-B4-G4-D128-L4128-near-end-gated", 4, 4, 4, 1, 4128, 128, ("gpu",), mask="near-end", block=None,
          gated=True),
    *[_case(f"{kind}-B2-G{G}-S{S}-L{L}-D{D}", 2, G, 2, S, L, D, ("gpu",), mask=kind, block=None, dtypes=HALF)
      for kind, S, L in (("causal", 700, 1100), ("window", 300, 1024), ("short-in-long", 129, 4128))
      for G, D in ((8, 256), (1, 128))],
    _case("prefill-B3-G1-Hkv4-S65-L130-D128", 3, 1, 4, 65, 130, 128, ("gpu",), block=None),
    _case("prefill-B1-G4-S63-L63-D64", 1, 4, 2, 63, 63, 64, ("gpu",), block=None),
    _case("prefill-B2-G3-S130-L200-D80-holes", 2, 3, 2, 130, 200, 80, ("gpu",), mask="holes", block=None),
    # B x G x S x L above REPEATED_MASK_MAX: the SDPA route calls once per query head
    _case("prefill-B1-G8-S2100-L2200-D128", 1, 8, 2, 2100, 2200, 128, ("gpu",), block=None),
    _case("prefill-B1-G8-S4096-L4128-D256-past0", 1, 8, 2, 4096, 4128, 256, ("gpu",), mask="past0", block=None,
          dtypes=(torch.bfloat16,)),
    _case("prefill-B2-G8-S2048-L4128-D256-strided", 2, 8, 2, 2048, 4128, 256, ("gpu",), block=None, strided=True,
          dtypes=(torch.bfloat16,)),
]

CASES = SMALL + GPU


def make_mask(case: Case, gen: torch.Generator) -> torch.Tensor:
    """The mask of `case` in its arriving shape (broadcastable to [B, 1, S, L] bool). Row b's
    queries sit at slots past_b .. past_b + S - 1 and read causally; past_b is random per row
    ("causal"), 0 ("past0"), L - S ("near-end": the last slots of the cache), or, for
    "decode-lengths", rows of visible lengths 1, L and one between (queries before a row's first
    slot read nothing). "short-in-long": a short context in a long cache (L >= 4 S). "window" keeps
    the last WINDOW slots, "holes" drops ~30% of the slots for every query of a row (slot 0, a sink,
    kept), "padded" gives row b n_b real queries, the rest read nothing; "all": every slot."""
    B = 1 if case.mask_shape.startswith("1-") else case.B
    S = 1 if case.mask_shape.endswith("1-L") else case.S
    L = case.L
    if case.mask == "decode-lengths":
        lengths = [L] if B == 1 else ([1, L] + torch.randint(1, L + 1, (B,), generator=gen).tolist())[:B]
        last = torch.tensor(lengths)[:, None] - (S - 1) + torch.arange(S)  # [B, S] slots read
        mask = torch.arange(L)[None, None, :] < last[:, :, None]
    else:
        if case.mask == "past0":
            past = torch.zeros(B, dtype=torch.int64)
        elif case.mask == "near-end":
            past = torch.full((B,), L - S, dtype=torch.int64)
        elif case.mask == "short-in-long":
            past = torch.randint(0, max(1, L // 4 - S), (B,), generator=gen)
        else:
            past = torch.randint(0, L - S + 1, (B,), generator=gen)
        pos = past[:, None] + torch.arange(S)  # [B, S]
        slot = torch.arange(L)
        mask = slot[None, None, :] <= pos[:, :, None]
        if case.mask == "all":
            mask = torch.ones(B, S, L, dtype=torch.bool)
        elif case.mask == "window":
            mask &= slot[None, None, :] > pos[:, :, None] - WINDOW
        elif case.mask == "holes":
            holes = torch.rand(B, 1, L, generator=gen) < 0.3
            holes[..., 0] = False
            mask &= ~holes
        elif case.mask == "padded":
            n = torch.randint(0, S + 1, (B,), generator=gen)
            n[0] = S
            mask &= (torch.arange(S)[None, :] < n[:, None])[:, :, None]
    mask = mask[:, None]  # [B, 1, S, L]
    if case.empty_rows:
        mask = mask.clone()
        mask[0] = False
        if case.B > 1 and case.S > 1:
            mask[1, 0, 1] = False
    return mask


def make_inputs(case: Case, dtype: torch.dtype, device: str, poison_unread: bool = False) -> dict:
    """Fresh random q (scores of std ~1.5: peaked and flat rows), key, value in `dtype`, the mask,
    scale D^-1/2 and, for gated cases, gate [B, S, H * D], on `device`. poison_unread: cache slots
    no query of their row may read hold NaN keys and inf values (the oracle sees the clean ones,
    under "clean_key" / "clean_value")."""
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
    B, H, Hkv, S, L, D = case.B, case.H, case.Hkv, case.S, case.L, case.D
    q = (1.5 * torch.randn(B, H, S, D, generator=gen)).to(dtype)
    key = torch.randn(B, Hkv, L, D, generator=gen).to(dtype)
    value = torch.randn(B, Hkv, L, D, generator=gen).to(dtype)
    mask = make_mask(case, gen)
    x = dict(q=q, key=key, value=value, mask=mask, scale=D ** -0.5,
             gate=torch.randn(B, S, H * D, generator=gen).to(dtype) if case.gated else None)
    x["clean_key"], x["clean_value"] = key, value
    if poison_unread:
        unread = ~mask.expand(B, 1, S, L).any(2)[:, :, :, None].expand(B, Hkv, L, D)
        x["key"] = key.masked_fill(unread, float("nan"))
        x["value"] = value.masked_fill(unread, float("inf"))
    x = {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in x.items()}
    if case.strided:  # [B, H, S, D] views of [B, S, H, D] (q) and [B, L, Hkv, D] (the cache)
        for n in ("q", "key", "value"):
            x[n] = x[n].transpose(1, 2).contiguous().transpose(1, 2)
    return x


def oracle(case: Case, x: dict) -> dict:
    """float64 o [B, H, S, D] (zeros on rows that read nothing) and, for gated cases, the layer's
    o [B, S, H, D] * sigmoid(gate), on x's device from the clean cache."""
    q = x["q"].double()
    key, value = x["clean_key"].double(), x["clean_value"].double()
    B, H, S, D = q.shape
    L = key.shape[2]
    k = key.repeat_interleave(case.G, 1)
    v = value.repeat_interleave(case.G, 1)
    s = (q @ k.transpose(-1, -2)) * x["scale"]
    s = s.masked_fill(~x["mask"].expand(B, 1, S, L), float("-inf"))
    o = torch.softmax(s, -1).nan_to_num(0.0) @ v
    want = {"o": o}
    if case.gated:
        want["gated"] = gate_output(o, x["gate"].double())
    return want


def gate_output(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """What the gated-attention layer makes of o [B, H, S, D]: o [B, S, H * D] * sigmoid(gate), in
    o's dtype (gdn_export.modules.gated_attention)."""
    B, H, S, D = o.shape
    return o.transpose(1, 2).reshape(B, S, H * D) * torch.sigmoid(gate.to(o.dtype))


def check(case: Case, dtype: torch.dtype, o: torch.Tensor, x: dict, want: dict) -> None:
    """o [B, H, S, D] in `dtype`: finite everywhere, within BOUND[dtype] of the oracle, exactly zero on
    query rows whose mask is all False; gated cases: the layer's gated output as well."""
    assert o.dtype == dtype and tuple(o.shape) == (case.B, case.H, case.S, case.D), (o.dtype, tuple(o.shape))
    o = o.detach().to(want["o"].device)
    assert torch.isfinite(o).all(), "o has a NaN / Inf (unwritten, or read a slot the mask hides)"
    err = rel_rms(o, want["o"])
    assert err <= BOUND[dtype], f"o: relative RMS {err:.3g} > {BOUND[dtype]:g} ({dtype})"
    B, H, S, _ = o.shape
    empty = ~x["mask"].to(o.device).expand(B, 1, S, case.L).any(-1)  # [B, 1, S]
    assert (o[empty.expand(B, H, S)] == 0).all(), "a query row that may read nothing is not zero"
    if case.gated:
        got = gate_output(o, x["gate"].to(o.device))
        err = rel_rms(got, want["gated"])
        assert err <= BOUND[dtype], f"gated o: relative RMS {err:.3g} > {BOUND[dtype]:g} ({dtype})"


# ------------------------------------------------------------------------------------ K/V write

# (cache dtype, update dtype): the same, and an fp32 update rounded into an fp16 cache on store
WRITE_DTYPES = {"bf16": (torch.bfloat16, torch.bfloat16), "fp16": (torch.float16, torch.float16),
                "fp32": (torch.float32, torch.float32), "fp32-into-fp16": (torch.float16, torch.float32)}


@dataclass(frozen=True)
class WriteCase:
    """B, Hkv, L, S, D: caches [B, Hkv, L, D], key / value [B, Hkv, S, D] (the attention layer's
    transposed [B, S, Hkv, D] projections), row b written at starts[b] .. starts[b] + S - 1.
    cache_view: the caches are every other slot of a larger buffer (the rest must not change).
    past_end: a row's slots run past L (outside the ops' contract: the model's layout keeps rows
    inside; the Triton kernel writes the slots inside and nothing beyond)."""

    name: str
    B: int
    Hkv: int
    L: int
    S: int
    D: int
    starts: tuple
    cache_view: bool = False
    past_end: bool = False
    tags: frozenset = field(default_factory=lambda: frozenset({"small"}))

    @property
    def cost(self) -> int:
        """Programs of the Triton kernel (one per (b, h, s); ~10 ms each interpreted on a 2-core CPU),
        scaled so that tests.ops.impl.INTERPRETED_CHEAP (2000) is ~0.3 s."""
        return self.B * self.Hkv * self.S * 70


def _write(name, B, Hkv, L, S, D, starts, tags=("small",), **kw):
    return WriteCase(name, B, Hkv, L, S, D, tuple(starts), tags=frozenset(tags), **kw)


WRITE_CASES = [
    _write("decode-B1-D256-last-slot", 1, 2, 40, 1, 256, [39]),
    _write("decode-B5-D96-ragged", 5, 3, 33, 1, 96, [0, 32, 7, 16, 31]),
    _write("decode-B3-D24-ragged", 3, 2, 41, 1, 24, [40, 0, 17]),
    _write("S7-B3-D80", 3, 2, 29, 7, 80, [0, 22, 9]),
    _write("S9-B2-Hkv3-D16", 2, 3, 30, 9, 16, [21, 4]),
    _write("S33-B2-D128-whole-cache", 2, 1, 33, 33, 128, [0, 0]),
    _write("S5-B4-Hkv5-D24", 4, 5, 18, 5, 24, [13, 3, 0, 8]),
    _write("S63-B2-D64-near-end", 2, 1, 70, 63, 64, [7, 0]),
    _write("S65-B3-D128-ragged", 3, 1, 140, 65, 128, [75, 0, 30]),
    _write("S130-B2-D80-near-end", 2, 1, 131, 130, 80, [1, 0]),
    _write("S3-B2-D16-cache-view", 2, 2, 12, 3, 16, [0, 9], cache_view=True),
    _write("S4-B2-D8-past-end", 2, 1, 10, 4, 8, [8, 0], past_end=True),
    # the model's sizes
    _write("decode-B32-Hkv2-D256-L4128", 32, 2, 4128, 1, 256, [4127, *range(0, 4096, 132)][:32], ("gpu",)),
    _write("S4096-B1-Hkv2-D256-L4128", 1, 2, 4128, 4096, 256, [32], ("gpu",)),
    _write("S65-B8-Hkv4-D128-L1000-ragged", 8, 4, 1000, 65, 128, [935, 0, 1, 64, 500, 300, 934, 17], ("gpu",)),
]


def make_write_inputs(case: WriteCase, dtypes: tuple, index_dtype: torch.dtype, device: str) -> dict:
    """Fresh random caches (every slot a write must leave alone keeps a random value, so a stray
    write shows), key / value as transposed [B, S, Hkv, D] views, write_indices [B], on `device`.
    cache_view: the caches are [:, :, ::2] of buffers "key_base" / "value_base"; past_end: the value
    cache is the first L slots of a buffer of 2 L ("key_base")."""
    cache_dtype, new_dtype = dtypes
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
    B, Hkv, L, S, D = case.B, case.Hkv, case.L, case.S, case.D
    x = {}
    if case.cache_view:
        x["key_base"] = torch.randn(B, Hkv, 2 * L, D, generator=gen).to(device=device, dtype=cache_dtype)
        x["value_base"] = torch.randn(B, Hkv, 2 * L, D, generator=gen).to(device=device, dtype=cache_dtype)
        x["key_cache"], x["value_cache"] = x["key_base"][:, :, ::2], x["value_base"][:, :, ::2]
    elif case.past_end:
        x["key_base"] = torch.randn(B, Hkv, 2 * L, D, generator=gen).to(device=device, dtype=cache_dtype)
        x["key_cache"] = x["key_base"][:, :, :L]
        x["value_cache"] = torch.randn(B, Hkv, L, D, generator=gen).to(device=device, dtype=cache_dtype)
    else:
        x["key_cache"] = torch.randn(B, Hkv, L, D, generator=gen).to(device=device, dtype=cache_dtype)
        x["value_cache"] = torch.randn(B, Hkv, L, D, generator=gen).to(device=device, dtype=cache_dtype)
    x["key"] = torch.randn(B, S, Hkv, D, generator=gen).to(device=device, dtype=new_dtype).transpose(1, 2)
    x["value"] = torch.randn(B, S, Hkv, D, generator=gen).to(device=device, dtype=new_dtype).transpose(1, 2)
    x["write_indices"] = torch.tensor(case.starts, dtype=index_dtype, device=device)
    return x


def write_oracle(case: WriteCase, x: dict) -> dict:
    """The caches after the write, by a Python loop over rows and tokens on CPU (slots past L
    dropped); for buffers around the caches, the buffers after it."""
    c = {n: t.detach().cpu().clone() for n, t in x.items() if n != "write_indices"}
    if case.cache_view:
        c["key_cache"], c["value_cache"] = c["key_base"][:, :, ::2], c["value_base"][:, :, ::2]
    elif case.past_end:
        c["key_cache"] = c["key_base"][:, :, :case.L]
    for b, start in enumerate(case.starts):
        for s in range(case.S):
            if start + s < case.L:
                c["key_cache"][b, :, start + s] = c["key"][b, :, s].to(c["key_cache"].dtype)
                c["value_cache"][b, :, start + s] = c["value"][b, :, s].to(c["value_cache"].dtype)
    return {n: c[n] for n in ("key_cache", "value_cache", "key_base", "value_base") if n in c}


def write_check(case: WriteCase, got: dict, want: dict) -> None:
    """Each cache (and each buffer around one) equal to the loop's, bit for bit."""
    for n, w in want.items():
        if n not in got:
            continue
        g = got[n].detach().cpu()
        assert g.dtype == w.dtype and g.shape == w.shape, (n, g.dtype, tuple(g.shape))
        assert torch.equal(g, w), f"{n}: {int((g != w).sum())} of {w.numel()} elements differ from the loop's write"
