"""The MoE op's contract, held by every implementation (impls.py) on every case that applies
(cases.py): ids are `impl-case-dtype`."""

import pytest
import torch

from tests.ops.impl import params
from tests.ops.moe.cases import CASES, Case, check, make_inputs, oracle
from tests.ops.moe.impls import IMPLS
from tests.conftest import assert_close_rms


@pytest.mark.parametrize("impl,case,dtype", params(IMPLS, CASES, None, cost=lambda c: c.cost))
def test_matches_reference(impl, case, dtype):
    impl.skip_if_unavailable()
    x = make_inputs(case, dtype, impl.device)
    check(case, dtype, impl.run(x, case), oracle(case, x))


@pytest.mark.parametrize("impl", [pytest.param(i, id=i.name, marks=i.marks()) for i in IMPLS
                                  if i.name in ("reference", "triton", "cuda", "onnxruntime")])
def test_unrouted_experts_are_never_read(impl):
    """NaN in the weights of experts no token picks must not reach the output."""
    impl.skip_if_unavailable()
    case = Case("unrouted", 5, 64, 8, 32, 2)
    x = make_inputs(case, torch.float32, "cpu")
    x["router_logits"][:, 4:] = -30.0
    want = oracle(case, x)
    x["gate_up"][4:], x["down"][4:] = float("nan"), float("nan")
    out = impl.run({n: t.to(impl.device) for n, t in x.items()}, case)
    assert torch.isfinite(out).all()
    assert_close_rms(out.cpu().float(), want, torch.float32, "out")
