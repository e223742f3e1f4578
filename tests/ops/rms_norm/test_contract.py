"""RMSNorm's contract, held by every implementation (impls.py) on every case (cases.py): ids are
`impl-case-dtype`."""

import pytest
import torch

from tests.ops.impl import params, runnable
from tests.ops.rms_norm.cases import CASES, check, make_inputs, oracle
from tests.ops.rms_norm.impls import IMPLS

RUN = runnable(CASES)


@pytest.mark.parametrize("impl,case,dtype", params(IMPLS, RUN, None, cost=lambda c: c.cost // 64))
def test_matches_float64_oracle(impl, case, dtype):
    impl.skip_if_unavailable()
    inp = make_inputs(case, dtype, impl.device)
    x_before = inp["x"].clone()
    y = impl.run(inp)
    check(y, oracle(inp), dtype, inp["x"].shape)
    assert torch.equal(inp["x"], x_before), "x was modified"


@pytest.mark.parametrize("impl", [pytest.param(i, id=i.name, marks=i.marks()) for i in IMPLS if i.name == "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_equals_pytorch_form(impl, dtype):
    """The fused kernel and the PyTorch form (what the graph and torch.compile run) agree to fp32
    rounding (1e-6 relative per element: the sum of squares runs in another order) before the one
    rounding to the output dtype (one ulp: 2^-7 relative in bf16), on a model-like decoder norm, fresh
    inputs per seed."""
    from gdn_export.ops.rms_norm.naive import rms_norm

    impl.skip_if_unavailable()
    for seed in range(3):
        case = CASES[2]
        inp = make_inputs(case, dtype, impl.device, seed=seed)
        fused = impl.run(inp).double()
        torch_form = rms_norm(inp["x"], inp["weight"], inp["eps"], inp["zero_centered"], inp["gate"]).double()
        rel = 1e-6 if dtype == torch.float32 else 2.0 ** -7
        worst = ((fused - torch_form).abs() / (torch_form.abs() * rel + 1e-30)).max().item()
        assert worst <= 1.0, f"seed {seed}: {worst:.2f} x the bound"
