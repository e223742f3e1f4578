"""Gated delta rule contract: the cases every implementation is held to, their inputs, a float64
oracle and the checker.

A case is a shape plus what makes it hard: Hv = 2 Hk, Dk != Dv, odd T (1, 63, 65, 130, 1000), keys
as a model makes them ("model-like", see tests.conftest.gdn_inputs), beta in (0, 2) (OLMo-Hybrid's
allow_neg_eigval), slow decay, no initial state / no L2 norm, a cu_seqlens pack against the
per-sequence loop, right-padded rows (g = beta = 0 past each row's end) against each row alone, and
the recurrent state stored in fp32, fp16 or bf16.

Tags say where a case runs: "small" cases run on every implementation (references, Triton under its
interpreter, ONNX Runtime, the plugin's host reference); "gpu" cases (long T, real head sizes) only on
the GPU implementations; "paths" cases also on the CUDA kernels with the recurrent or chunked path
pinned; "triton-ok" marks GPU cases whose head sizes the Triton kernels take.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gdn_export.ops.gated_delta_rule.naive import (chunked_gated_delta_rule, l2norm,
                                                   recurrent_gated_delta_rule)
from tests.conftest import RMS_BOUND, gdn_inputs, rel_rms
from tests.ragged import gdr_padded_inputs, pack, with_beta_up_to_2

ALL = (torch.float32, torch.bfloat16, torch.float16)
HALF = (torch.bfloat16, torch.float16)
# Kernel and oracle round nearly equal values: now and then one 16-bit step apart.
STATE_BOUND = {torch.float32: 0.0, torch.bfloat16: 6e-3, torch.float16: 1e-3}
# The fp32 references against the float64 oracle (fp32 activations and state).
REFERENCE_BOUND = 1e-5


@dataclass(frozen=True)
class Case:
    """One gated-delta-rule input class.

    B, T, Hk, Hv, Dk, Dv: the op's dims (q, k [B, T, Hk, Dk], v [B, T, Hv, Dv]). For a pack, B = 1 and
    T = sum(pack); for padded rows, B = len(padded). state_dtype: storage of initial / final state.
    decay: multiplies g (0.02: the state carried across chunks dominates). dtypes: activation dtypes
    (default all three). tags: see the module docstring.
    """

    name: str
    B: int
    T: int
    Hk: int
    Hv: int
    Dk: int
    Dv: int
    state_dtype: torch.dtype = torch.float32
    state: bool = True
    l2norm: bool = True
    scale: float | None = None
    correlated: bool = False
    beta2: bool = False
    decay: float = 1.0
    pack: tuple | None = None
    padded: tuple | None = None
    padded_as_pack: bool = False
    dtypes: tuple = ALL
    tags: frozenset = field(default_factory=lambda: frozenset({"small"}))

    @property
    def N(self) -> int:
        """Number of sequences (rows of the state)."""
        return len(self.pack) if self.pack else self.B

    @property
    def varlen(self) -> bool:
        return self.pack is not None or self.padded_as_pack

    @property
    def cost(self) -> int:
        """Token-heads at a 32 x 32 state: what an interpreted kernel's run time grows with."""
        return self.B * self.T * self.Hv * max(1, self.Dk * self.Dv // 1024)


def _case(name, B, T, Hk, Hv, Dk, Dv, tags=("small",), **kw):
    return Case(name, B, T, Hk, Hv, Dk, Dv, tags=frozenset(tags), **kw)


def _packed(name, lens, Hk, Hv, Dk, Dv, tags=("small", "paths"), **kw):
    return _case(name, 1, sum(lens), Hk, Hv, Dk, Dv, tags, pack=tuple(lens), state=True, **kw)


SMALL = [
    _case("T1-B3-Hv2Hk-DkneDv", 3, 1, 1, 2, 16, 32, ("small", "paths", "op")),
    _case("T5-B3-Hv2Hk-DkneDv", 3, 5, 1, 2, 16, 32, ("small", "paths")),
    _case("T63-DkneDv", 1, 63, 2, 2, 32, 16),
    _case("T65-B3-Hv2Hk", 3, 65, 1, 2, 16, 16, ("small", "op")),
    _case("T130-Hv2Hk", 1, 130, 2, 4, 32, 32),
    _case("T200-slow-decay", 1, 200, 1, 2, 32, 32, decay=0.02),
    _case("T130-Hv2Hk-model-like", 1, 130, 2, 4, 32, 32, correlated=True),
    _case("T64-B2-model-like", 2, 64, 1, 1, 16, 16, correlated=True),
    # head dims multiples of 64: 16-bit q, k, v straight into the tensor cores (Triton's raw operands)
    _case("T70-Hv2Hk-Dk64-Dv128", 1, 70, 1, 2, 64, 128, dtypes=HALF),
    _case("T65-B2-D64-model-like", 2, 65, 1, 1, 64, 64, correlated=True, dtypes=HALF),
    _case("T70-no-l2norm-no-state-scale0.7", 2, 70, 1, 2, 16, 32, l2norm=False, state=False, scale=0.7),
    _case("T33-Hv3Hk-Dk24-Dv8-no-l2norm", 1, 33, 1, 3, 24, 8, l2norm=False),
    _case("T1-no-l2norm-no-state", 2, 1, 2, 2, 16, 16, ("small", "paths", "op"), l2norm=False, state=False),
    # beta in (0, 2)
    *[_case(f"T{T}-beta2-{kind}", 2, T, 1, 2, 16, 32, ("small", "paths"), beta2=True, correlated=kind == "model-like")
      for T in (1, 63, 65, 130) for kind in ("random", "model-like")],
    # right-padded rows of lengths 1, 63, 130 (g = beta = 0 past each end) against each row alone
    *[_case(f"padded-1-63-130-{kind}", 3, 130, 1, 2, 16, 32, ("small", "paths", "op"), padded=(1, 63, 130),
            correlated=kind == "model-like") for kind in ("random", "model-like")],
    _case("padded-1-63-130-as-pack-model-like", 3, 130, 1, 2, 16, 32, ("small", "paths"), padded=(1, 63, 130),
          padded_as_pack=True, correlated=True),
    # cu_seqlens packs against the per-sequence loop: 130 spans three chunks after a sequence that
    # ends mid-chunk; an empty sequence keeps its initial state
    _packed("pack-5-65-1-0-130-30", (5, 65, 1, 0, 130, 30), 1, 2, 16, 32, ("small", "paths", "op")),
    _packed("pack-5-65-1-0-130-30-Dk64-Dv128", (5, 65, 1, 0, 130, 30), 1, 2, 64, 128),
    _packed("pack-3-1-0-7", (3, 1, 0, 7), 1, 2, 16, 32),
    _packed("pack-1-1-1-1-decode", (1, 1, 1, 1), 1, 2, 16, 32, ("small", "paths", "op")),
]

# 16-bit recurrent state: rounded once per call, where it is stored
STATE16 = [
    *[_case(f"{name}-{sid}-state", B, T, Hk, Hv, Dk, Dv, ("small", "paths", "op") if T == 1 else ("small", "paths"),
            state_dtype=sd)
      for name, (B, T, Hk, Hv, Dk, Dv) in {"T1-B3-Hv2Hk-DkneDv": (3, 1, 1, 2, 16, 32),
                                             "T5-DkneDv": (1, 5, 2, 2, 32, 16),
                                             "T63-DkneDv": (1, 63, 2, 2, 32, 16),
                                             "T130-B2-Hv2Hk": (2, 130, 1, 2, 16, 16)}.items()
      for sd, sid in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16"))],
    *[_case(f"{name}-model-like-{sid}-state", 2, T, 1, 2, D, D, state_dtype=sd, correlated=True,
            dtypes=(torch.bfloat16,))
      for name, T, D in (("T65-D64", 65, 64), ("T1", 1, 16))
      for sd, sid in ((torch.bfloat16, "bf16"), (torch.float16, "fp16"))],
    *[_packed(f"{name}-{sid}-state", lens, 1, 2, 16, 32, state_dtype=sd, dtypes=(torch.float16,))
      for name, lens in (("pack-5-65-1-70", (5, 65, 1, 70)), ("pack-3-1-7", (3, 1, 7)),
                         ("pack-1-1-1-1-decode", (1, 1, 1, 1)))
      for sd, sid in ((torch.bfloat16, "bf16"), (torch.float16, "fp16"))],
]

# Long sequences and real head sizes: the GPU implementations only (B x Hv crossed once, not fully:
# batch and head group index the kernels' grids independently).
GPU = [
    *[_case(f"T{T}-D{D}-{'B1-Hv=Hk' if one else 'B3-Hv=2Hk'}", 1 if one else 3, T, 2, 2 if one else 4, D, D,
            ("gpu", "triton-ok", "op") if T in (1, 1000) and D == 128 else ("gpu", "triton-ok"))
      for T in (1, 63, 64, 65, 1000, 4097) for D in (64, 128) for one in (True, False)],
    *[_case(f"T{T}-D{D}-model-like", 2, T, 2, 4, D, D, ("gpu", "triton-ok"), correlated=True)
      for T in (65, 1000, 4097) for D in (64, 128)],
    # the kernels' path choice around its switch points, and each path pinned (tag "paths")
    *[_case(f"T{T}-D64-Hv2Hk", 2, T, 2, 4, 64, 64, ("gpu", "paths", "triton-ok")) for T in (16, 17, 200, 1000)],
    *[_case(f"T{T}-Dk{Dk}-Dv{Dv}", 2, T, 1, 3, Dk, Dv,
            ("gpu", "triton-ok") if {Dk, Dv} <= {16, 32, 64, 128} else ("gpu",))
      for T in (1, 130) for Dk, Dv in ((64, 128), (128, 64), (32, 64), (16, 16), (24, 40), (40, 24), (72, 96),
                                       (256, 64), (20, 36))],
    *[_case(f"T{T}-D64-{'state' if st else 'no-state'}-{'l2norm' if l2 else 'no-l2norm'}", 2, T, 2, 2, 64, 64,
            ("gpu", "triton-ok"), state=st, l2norm=l2)
      for T in (1, 7, 300) for st in (True, False) for l2 in (True, False)],
    *[_packed(f"pack-{'-'.join(map(str, lens))}-D64", lens, 2, 4, 64, 64, ("gpu", "paths", "triton-ok"))
      for lens in ((1, 63, 66, 1000), (5, 3, 1), (64, 64, 128), (1, 1, 1, 1, 1), (700,), (17, 300, 2, 65))],
    *[_packed(f"pack-{'-'.join(map(str, lens))}-D128", lens, 2, 4, 128, 128, ("gpu", "paths", "triton-ok"))
      for lens in ((1000, 1, 64, 65, 4097), (1, 3, 16, 2))],
    *[_case(f"padded-1-63-130-D{D}-Hv2Hk-{kind}", 3, 130, 2, 4, D, D, ("gpu", "paths", "triton-ok"), padded=(1, 63, 130),
            correlated=kind == "model-like") for D in (64, 128) for kind in ("random", "model-like")],
    _case("padded-1-63-130-as-pack-Dk128-Dv64", 3, 130, 2, 4, 128, 64, ("gpu", "paths", "triton-ok"),
          padded=(1, 63, 130), padded_as_pack=True, correlated=True, dtypes=(torch.bfloat16,)),
    *[_case(f"T{T}-D128-beta2-{kind}", 2, T, 2, 4, 128, 128, ("gpu", "paths", "triton-ok"), beta2=True,
            correlated=kind == "model-like") for T in (1, 63, 130, 1000) for kind in ("random", "model-like")],
    # 16-bit states at real sizes
    *[_case(f"T{T}-Dk{Dk}-Dv{Dv}-{sid}-state", 3, T, 2, 4, Dk, Dv, ("gpu", "triton-ok"), state_dtype=sd)
      for T in (1, 3, 65, 1000) for Dk, Dv in ((128, 128), (64, 128))
      for sd, sid in ((torch.bfloat16, "bf16"), (torch.float16, "fp16"))],
    # T = 1 with a 16-bit state (the decode kernel's state tile in shared memory): Dk below its tile's
    # rows, Dv not a multiple of 8, several column blocks
    *[_case(f"decode-Dk{Dk}-Dv{Dv}-{sid}-state{'-no-state' if not st else ''}", 5, 1, 3, 6, Dk, Dv, ("gpu",),
            state_dtype=sd, correlated=True, state=st)
      for Dk, Dv in ((16, 8), (48, 24), (100, 100), (128, 130), (64, 36), (256, 256), (128, 128))
      for sd, sid in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")) for st in (True, False)],
    *[_case(f"T130-D128-model-like-{sid}-state", 2, 130, 2, 4, 128, 128, ("gpu", "paths", "triton-ok"),
            state_dtype=sd, correlated=True, dtypes=(torch.bfloat16,))
      for sd, sid in ((torch.bfloat16, "bf16"), (torch.float16, "fp16"))],
    *[_packed(f"pack-{'-'.join(map(str, lens))}-D64-{sid}-state", lens, 2, 4, 64, 64, ("gpu", "paths", "triton-ok"),
              state_dtype=sd, dtypes=(torch.bfloat16,))
      for lens in ((1, 1, 1, 1), (5, 65, 1, 300)) for sd, sid in ((torch.bfloat16, "bf16"), (torch.float16, "fp16"))],
]

CASES = SMALL + STATE16 + GPU


def make_inputs(case: Case, dtype: torch.dtype, device: str) -> dict:
    """Fresh random inputs of `case` in activation `dtype` on `device`: q, k, v, g, beta,
    initial_state (in case.state_dtype, or None) and cu_seqlens (int32, or None)."""
    if case.padded:
        x = gdr_padded_inputs(case.padded, case.T, case.Hk, case.Hv, case.Dk, case.Dv, dtype, device,
                              correlated=case.correlated, seed=int(torch.randint(0, 2**31 - 1, ()).item()))
        x["cu_seqlens"] = None
        if case.padded_as_pack:
            x, x["cu_seqlens"] = pack(x)
    elif case.pack:
        x = gdn_inputs(1, case.T, case.Hk, case.Hv, case.Dk, case.Dv, dtype=dtype, device=device, state=False,
                       correlated=case.correlated)
        x["initial_state"] = torch.randn(case.N, case.Hv, case.Dk, case.Dv, device=device) * 0.1
        x["cu_seqlens"] = torch.tensor((0, *case.pack), device=device).cumsum(0).to(torch.int32)
    else:
        x = gdn_inputs(case.B, case.T, case.Hk, case.Hv, case.Dk, case.Dv, dtype=dtype, device=device,
                       state=case.state, correlated=case.correlated)
        x["cu_seqlens"] = None
    if not case.l2norm:  # keys of norm below 1 keep the recurrence contractive without the in-kernel norm
        x["k"] = (0.9 * l2norm(x["k"].float())).to(dtype)
    if case.beta2:
        x = with_beta_up_to_2(x)
    if case.decay != 1.0:
        x["g"] = x["g"] * case.decay
    if x["initial_state"] is not None:
        x["initial_state"] = x["initial_state"].to(case.state_dtype)
    return x


def _float64(x: dict) -> dict:
    return {n: (t.double() if t is not None and t.is_floating_point() else t) for n, t in x.items()}


def oracle(case: Case, x: dict):
    """(o, final_state) in float64 from a literal step-by-step recurrence on x's device (a chunked one in
    float64 above 256 tokens); padded rows each alone on their own tokens. Call it before running
    an in-place implementation (which overwrites x's state)."""
    scale = case.scale
    if case.padded:
        rows = _float64({n: x[n] for n in ("q", "k", "v", "g", "beta")})
        s0 = x["initial_state"].double()
        T = case.T
        if case.padded_as_pack:
            rows = {n: t.reshape(case.B, T, *t.shape[2:]) for n, t in rows.items()}
        outs, states = [], []
        for b, L in enumerate(case.padded):
            row = {n: t[b : b + 1, :L] for n, t in rows.items()}
            o, s = recurrent_gated_delta_rule(**row, initial_state=s0[b : b + 1], scale=scale,
                                              use_qk_l2norm=case.l2norm)
            outs.append(o[0])
            states.append(s)
        return outs, torch.cat(states)
    xd = _float64(x)
    fn = chunked_gated_delta_rule if case.T > 256 else recurrent_gated_delta_rule
    state = xd.pop("initial_state")
    if state is None:
        state = torch.zeros(case.N, case.Hv, case.Dk, case.Dv, dtype=torch.float64, device=x["v"].device)
    return fn(**xd, initial_state=state, scale=scale, use_qk_l2norm=case.l2norm)


def check(case: Case, dtype: torch.dtype, o: torch.Tensor, state: torch.Tensor, want, tight: bool = False):
    """o [B, T, Hv, Dv] (v's dtype) and final_state [N, Hv, Dk, Dv] (case.state_dtype) against the oracle:
    relative RMS within RMS_BOUND[dtype] (the state within its storage's rounding as well; 2x for
    model-like keys through a 16-bit state), REFERENCE_BOUND for an fp32 reference (`tight`).
    Padded rows: o on real tokens, finite everywhere."""
    assert o.dtype == dtype, f"o is {o.dtype}, want {dtype}"
    assert state.dtype == case.state_dtype, f"final_state is {state.dtype}, want {case.state_dtype}"
    assert tuple(state.shape) == (case.N, case.Hv, case.Dk, case.Dv), tuple(state.shape)
    o, state = o.detach(), state.detach()
    want_o, want_s = want
    bound = RMS_BOUND[dtype] * (2 if case.correlated and case.state_dtype != torch.float32 else 1)
    if tight and dtype == torch.float32 and case.state_dtype == torch.float32:
        bound = REFERENCE_BOUND
    if case.padded:
        assert torch.isfinite(o.float()).all(), "o has a NaN / Inf (padded positions must stay finite)"
        o = o.reshape(case.B, case.T, case.Hv, case.Dv)
        got = torch.cat([o[b, :L] for b, L in enumerate(case.padded)])
        want_o = torch.cat(want_o)
        o = got
    else:
        assert tuple(o.shape) == tuple(want_o.shape), (tuple(o.shape), tuple(want_o.shape))
    err_o = rel_rms(o.to(want_o.device), want_o)
    assert err_o <= bound, f"o: relative RMS {err_o:.3g} > {bound:g} ({dtype}, {case.state_dtype} state)"
    err_s = rel_rms(state.to(want_s.device), want_s)
    s_bound = max(bound, STATE_BOUND[case.state_dtype])
    assert err_s <= s_bound, f"final_state: relative RMS {err_s:.3g} > {s_bound:g} ({case.state_dtype})"
