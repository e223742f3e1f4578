"""16-bit recurrent state at the op level: the references round exactly once per call, where the
state is stored, and the op's dtype contract (final_state in initial_state's dtype) holds."""

import pytest
import torch

from gdn_export.ops import gated_delta_rule
from gdn_export.ops.gated_delta_rule.naive import chunked_gated_delta_rule, recurrent_gated_delta_rule
from tests.conftest import gdn_inputs, rel_rms

STATE_DTYPES = [pytest.param(torch.bfloat16, id="bf16-state"), pytest.param(torch.float16, id="fp16-state")]
REFERENCES = {"recurrent": recurrent_gated_delta_rule, "chunked": chunked_gated_delta_rule}
SHAPES = [
    # B, T, Hk, Hv, Dk, Dv
    pytest.param(1, 1, 1, 1, 8, 8, id="T1"),
    pytest.param(2, 63, 2, 4, 16, 24, id="T63-Hv2Hk-DkneDv"),
    pytest.param(3, 130, 1, 2, 16, 8, id="T130-Hv2Hk-DkneDv"),
]


@pytest.mark.parametrize("ref", list(REFERENCES))
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("B,T,Hk,Hv,Dk,Dv", SHAPES)
def test_reference_rounds_only_the_stored_state(B, T, Hk, Hv, Dk, Dv, state_dtype, ref):
    # With the same (16-bit-representable) initial state, the 16-bit-state reference must give the
    # fp32-state reference's o bit for bit and its final state rounded once: no rounding inside.
    x = gdn_inputs(B, T, Hk, Hv, Dk, Dv, correlated=True)
    s16 = x["initial_state"].to(state_dtype)
    o32, f32 = REFERENCES[ref](**{**x, "initial_state": s16.float()}, use_qk_l2norm=True)
    o16, f16 = REFERENCES[ref](**{**x, "initial_state": s16}, use_qk_l2norm=True)
    assert f16.dtype == state_dtype and f32.dtype == torch.float32
    assert torch.equal(o16, o32)
    assert torch.equal(f16, f32.to(state_dtype))
    # and the rounding is a real one: the states differ by about the 16-bit unit roundoff
    err = rel_rms(f16, f32)
    assert 0 < err < (4e-3 if state_dtype == torch.bfloat16 else 5e-4), err


@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_varlen_rounds_each_sequence_once(state_dtype):
    x = gdn_inputs(1, 90, 2, 4, 8, 8, state=False)
    cu = torch.tensor([0, 1, 40, 90])
    s0 = (torch.randn(3, 4, 8, 8) * 0.1).to(state_dtype)
    o, s = chunked_gated_delta_rule(**{**x, "initial_state": s0}, use_qk_l2norm=True, cu_seqlens=cu)
    assert s.dtype == state_dtype
    for n, (a, b) in enumerate([(0, 1), (1, 40), (40, 90)]):
        part = {key: val[:, a:b] for key, val in x.items() if val is not None}
        _, s_n = recurrent_gated_delta_rule(**part, initial_state=s0[n : n + 1].float(), use_qk_l2norm=True)
        # the two fp32 computations differ by ~1e-6: allow one 16-bit step where they straddle one
        torch.testing.assert_close(s[n : n + 1].float(), s_n.to(state_dtype).float(), atol=1e-3, rtol=1e-2)


@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_decode_rounds_every_step(state_dtype):
    # Decode steps chained through a 16-bit state = the fp32 recurrence with a rounding after each
    # step (a literal loop here), and drift measurably from the unrounded fp32 chain.
    x = gdn_inputs(2, 40, 1, 2, 16, 16, correlated=True)
    s16 = x["initial_state"].to(state_dtype)
    s_lit = s16.float()
    s_32 = s16.float()
    for t in range(40):
        step = {key: val[:, t : t + 1] for key, val in x.items() if key != "initial_state"}
        o, s16 = gated_delta_rule(**step, initial_state=s16, use_qk_l2norm=True)
        o_lit, s_lit = recurrent_gated_delta_rule(**step, initial_state=s_lit, use_qk_l2norm=True)
        s_lit = s_lit.to(state_dtype).float()
        _, s_32 = recurrent_gated_delta_rule(**step, initial_state=s_32, use_qk_l2norm=True)
        assert s16.dtype == state_dtype
        assert torch.equal(o, o_lit)
    assert torch.equal(s16.float(), s_lit)
    assert rel_rms(s16, s_32) > 0


def test_state_dtype_argument_and_fake():
    x = gdn_inputs(2, 5, 1, 2, 8, 8, dtype=torch.bfloat16, state=False)
    o, s = gated_delta_rule(**x, state_dtype=torch.float16)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float16
    _, s_none = gated_delta_rule(**x)
    assert s_none.dtype == torch.float32
    torch.testing.assert_close(s.float(), s_none, atol=2e-3, rtol=2e-3)
    # register_fake follows initial_state's dtype (what torch.export sees)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fx = {key: (mode.from_tensor(val) if val is not None else None) for key, val in x.items()}
        fx["initial_state"] = torch.zeros(2, 2, 8, 8, dtype=torch.bfloat16)
        _, fs = gated_delta_rule(**fx)
    assert fs.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(state_dtype=torch.int8), "state_dtype must be"),
        (dict(state_dtype=torch.float16, initial_state=torch.zeros(1, 2, 8, 8, dtype=torch.bfloat16)),
         "initial_state is torch.bfloat16 but state_dtype is torch.float16"),
        (dict(initial_state=torch.zeros(1, 2, 8, 8, dtype=torch.int32)), "initial_state must be float32"),
    ],
    ids=["bad-state-dtype", "mismatch", "int-state"],
)
def test_bad_state_dtypes_raise_named_errors(kwargs, match):
    x = gdn_inputs(1, 3, 1, 2, 8, 8, state=False)
    with pytest.raises(ValueError, match=match):
        gated_delta_rule(**{**x, **kwargs})
