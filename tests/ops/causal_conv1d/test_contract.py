"""The causal conv1d's contract, held by every implementation (impls.py) on every case that applies
(cases.py): ids are `impl-case-dtype`."""

import pytest
import torch

from tests.ops.causal_conv1d.cases import CASES, Case, check, make_inputs, oracle
from tests.ops.causal_conv1d.impls import IMPLS
from tests.ops.impl import params


@pytest.mark.parametrize("impl,case,dtype", params(IMPLS, CASES, None, cost=lambda c: c.cost // 2000))
def test_matches_float64_oracle(impl, case, dtype):
    impl.skip_if_unavailable()
    x = make_inputs(case, dtype, impl.device)
    want = oracle(case, x)  # first: an in-place entry overwrites x's conv_state
    given = x["conv_state"]
    y, s = impl.run(x, case)
    if impl.extra.get("inplace"):
        assert s.data_ptr() == given.data_ptr()
    check(case, dtype, y, s, want, tight=impl.kind in ("reference", "host"))


@pytest.mark.parametrize("impl", [pytest.param(i, id=i.name, marks=i.marks()) for i in IMPLS
                                  if i.name in ("reference", "op-reference", "triton", "cuda", "cuda-inplace")])
def test_decode_steps_equal_one_pass(impl):
    """T single-token calls chained through the state give the prefill's y and state."""
    impl.skip_if_unavailable()
    case = Case("chain", 2, 20, 24, 4)
    x = make_inputs(case, torch.float32, impl.device)
    y_all, s_all, _ = oracle(case, x)
    state = x["conv_state"]
    step_case = Case("step", 2, 1, 24, 4)
    ys = []
    for t in range(20):
        y, state = impl.run({**x, "x": x["x"][:, t : t + 1].contiguous(), "conv_state": state}, step_case)
        ys.append(y.cpu())
    torch.testing.assert_close(torch.cat(ys, 1).double(), y_all, atol=1e-5, rtol=1e-5)
    assert torch.equal(state.cpu(), s_all.float())


@pytest.mark.parametrize("impl", [pytest.param(i, id=i.name, marks=i.marks()) for i in IMPLS
                                  if i.name in ("triton", "cuda")])
def test_out_of_range_lengths_are_clamped(impl):
    """Kernels clamp seq_lens to [0, T] (the public op refuses them before): 9 reads as 6, -3 as 0."""
    from tests.ragged import check_conv_rows, conv_ragged_inputs

    impl.skip_if_unavailable()
    x, w, b, s0, _ = conv_ragged_inputs([6, 6, 6], 6, 64, 4, torch.float32, impl.device)
    lens = torch.tensor([9, -3, 6], dtype=torch.int32, device=impl.device)
    y, s = impl.run(dict(x=x, weight=w, bias=b, conv_state=s0, seq_lens=lens), Case("clamp", 3, 6, 64, 4))
    check_conv_rows(y, s, x, w, b, s0, torch.tensor([6, 0, 6]), True, torch.float32)
