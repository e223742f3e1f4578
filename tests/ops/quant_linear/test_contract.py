"""The quantized linear ops' contract (gdn_export.ops.quant_linear), held by every implementation
(impls.py) on every case that applies (cases.py): fp8 per-channel, fp8 128 x 128 blocks, int4 groups of
32 and 128; M = 1, 3, 40, 65; K and N off the tile multiples; random and model-like activations;
NaN-poisoned buffers. Ids are `impl-case-dtype`."""

import pytest
import torch

from tests.ops.impl import params
from tests.ops.quant_linear.cases import CASES, check, make_inputs, oracle
from tests.ops.quant_linear.impls import IMPLS


@pytest.mark.parametrize("impl,case,dtype", params(IMPLS, CASES, (torch.float32, torch.float16, torch.bfloat16),
                                                   cost=lambda c: c.cost // 200))
def test_matches_float64_oracle(impl, case, dtype):
    impl.skip_if_unavailable()
    x = make_inputs(case, dtype, impl.device, seed=1)
    y = impl.run(x, case)
    check(case, dtype, y, oracle(case, x), tight=impl.kind == "reference")


@pytest.mark.parametrize("impl", [pytest.param(i, id=i.name, marks=i.marks()) for i in IMPLS
                                  if i.name in ("reference", "op", "op-cuda", "triton")])
def test_leading_dims_are_rows(impl):
    """x [B, T, K] gives y [B, T, N] equal to the [B*T, K] call's rows."""
    from tests.ops.quant_linear.cases import Case

    impl.skip_if_unavailable()
    case = Case("rows", 6, 200, 63, "fp8", kind="model")
    x = make_inputs(case, torch.float32, impl.device, seed=2)
    flat = impl.run(x, case)
    y = impl.run(dict(x, x=x["x"].reshape(2, 3, 200)), case)
    assert y.shape == (2, 3, 63)
    torch.testing.assert_close(y.reshape(6, 63), flat, rtol=1e-6, atol=1e-6)
