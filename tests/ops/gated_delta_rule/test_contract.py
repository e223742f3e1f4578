"""The gated delta rule's contract, held by every implementation (tests/ops/gated_delta_rule/
impls.py) on every case that applies to it (cases.py): ids are `impl-case-dtype`.

`pytest tests/ops/gated_delta_rule -k triton-chunk` runs one implementation; `-m gpu` the GPU
ones (skipped with the reason on a machine without CUDA).
"""

import pytest
import torch

from tests.conftest import RMS_BOUND, rel_rms
from tests.ops.gated_delta_rule.cases import CASES, STATE_BOUND, check, make_inputs, oracle
from tests.ops.gated_delta_rule.impls import IMPLS
from tests.ops.impl import dtype_id, params


@pytest.mark.parametrize("impl,case,dtype", params(IMPLS, CASES, None, cost=lambda c: c.cost))
def test_matches_float64_oracle(impl, case, dtype):
    impl.skip_if_unavailable()
    x = make_inputs(case, dtype, impl.device)
    want = oracle(case, x)  # first: an in-place entry overwrites x's state
    given = x["initial_state"]
    o, s = impl.run(x, case)
    if impl.extra.get("inplace"):
        assert s.data_ptr() == given.data_ptr(), "the in-place entry did not update the state it was given"
    elif given is not None:
        assert s.data_ptr() != given.data_ptr(), "a functional entry overwrote initial_state"
    check(case, dtype, o, s, want, tight=impl.kind in ("reference", "host"))


INPLACE = [i for i in IMPLS if i.extra.get("inplace")]
# (B, T, Hk, Hv, Dk, Dv): a CPU-sized chain everywhere, a real-sized one on the GPU implementations
CHAINS = {"B2-T12-Hv2Hk-Dk16-Dv32": (2, 12, 1, 2, 16, 32), "B64-T32-Hk16-Hv32-D128": (64, 32, 16, 32, 128, 128)}


def _chain_params():
    out = []
    for impl in INPLACE:
        for name, dims in CHAINS.items():
            if dims[0] > 2 and impl.device == "cpu":
                continue
            for sd in (torch.float32, torch.bfloat16, torch.float16):
                out.append(pytest.param(impl, dims, sd, id=f"{impl.name}-{name}-{dtype_id(sd)}-state",
                                        marks=impl.marks(2 * 12 * 2 * 4)))
    return out


@pytest.mark.parametrize("impl,dims,state_dtype", _chain_params())
def test_decode_chain_rounds_like_the_reference(impl, dims, state_dtype):
    """T decode steps updating one state in place (bf16 activations, model-like keys): each step rounds
    the state once, as the reference with the same storage does, and o follows step by step."""
    from gdn_export.ops.gated_delta_rule.naive import recurrent_gated_delta_rule
    from tests.conftest import gdn_inputs
    from tests.ops.gated_delta_rule.cases import Case

    impl.skip_if_unavailable()
    B, T, Hk, Hv, Dk, Dv = dims
    x = gdn_inputs(B, T, Hk, Hv, Dk, Dv, dtype=torch.bfloat16, device=impl.device, correlated=True)
    state = x["initial_state"].to(state_dtype)
    ref_state = state.cpu().clone()
    case = Case("step", B, 1, Hk, Hv, Dk, Dv, state_dtype=state_dtype)
    for t in range(T):
        step = {n: val[:, t : t + 1] for n, val in x.items() if n != "initial_state"}
        o, s = impl.run({**step, "initial_state": state, "cu_seqlens": None}, case)
        assert s.data_ptr() == state.data_ptr()
        ro, ref_state = recurrent_gated_delta_rule(**{n: v.cpu() for n, v in step.items()},
                                                   initial_state=ref_state, use_qk_l2norm=True)
        assert rel_rms(o.cpu(), ro) <= RMS_BOUND[torch.bfloat16], (t, rel_rms(o.cpu(), ro))
    assert state.dtype == state_dtype and ref_state.dtype == state_dtype
    bound = max(RMS_BOUND[torch.bfloat16], STATE_BOUND[state_dtype])
    assert rel_rms(state.cpu(), ref_state) <= bound


@pytest.mark.parametrize("impl", [pytest.param(i, id=i.name, marks=i.marks()) for i in IMPLS
                                  if i.kind in ("reference", "host")])
def test_zero_gate_and_beta_is_an_identity_step(impl):
    """g = 0 and beta = 0 (a padded position) leave the state exactly unchanged in an fp32 reference."""
    from tests.ops.gated_delta_rule.cases import Case
    from tests.conftest import gdn_inputs

    impl.skip_if_unavailable()
    x = gdn_inputs(2, 7, 1, 2, 16, 8)
    x["g"].zero_()
    x["beta"].zero_()
    x["cu_seqlens"] = None
    s0 = x["initial_state"].clone()
    _, s = impl.run(x, Case("identity", 2, 7, 1, 2, 16, 8))
    torch.testing.assert_close(s.float(), s0, rtol=0, atol=1e-6 if impl.kind == "host" else 0)
