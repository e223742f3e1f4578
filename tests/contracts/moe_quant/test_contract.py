"""The quantized MoE ops' contract (gdn_export.ops.moe.quant), held by the fp32 reference through
the public entries and by the Triton kernels (on the GPU; under TRITON_INTERPRET=1 on the small
cases without one), every weight form, outputs NaN-poisoned: ids `impl-form-case-dtype`."""

from __future__ import annotations

import pytest
import torch

from tests.contracts.impl import HAS_CUDA, NO_GPU
from tests.contracts.moe_quant.cases import ALL, CASES, FORMS, Case, args, check, make_inputs, oracle


def _op(x, case):
    from gdn_export.ops.moe.quant import moe_fp8, moe_int4

    return (moe_fp8 if x["form"].startswith("fp8") else moe_int4)(*args(x, case))


def _triton(x, case):
    from gdn_export.ops.moe import quant_triton

    return (quant_triton.moe_fp8 if x["form"].startswith("fp8") else quant_triton.moe_int4)(*args(x, case))


def _params():
    out = []
    for impl, run in (("op", _op), ("triton", _triton)):
        device = "cuda" if impl == "triton" and HAS_CUDA else "cpu"
        for n, case in enumerate(CASES):
            gpu_case = "gpu" in case.tags
            if gpu_case and impl != "triton":
                continue
            marks = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU)] if gpu_case else (
                [pytest.mark.gpu] if device == "cuda" else [])
            for f, form in enumerate(FORMS):
                dtypes = ALL if (device == "cuda" or impl == "op") else (
                    (torch.float32, (torch.bfloat16, torch.float16)[(n + f) % 2]))  # interpreter: fp32 + one 16-bit
                for dtype in dtypes:
                    did = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
                    out.append(pytest.param(run, device, case, form, dtype, id=f"{impl}-{form}-{case.name}-{did}",
                                            marks=marks))
    return out


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every floating torch.empty the ops allocate (act, per-pair outputs) starts as NaN."""
    empty = torch.empty

    def nan_empty(*a, **k):
        t = empty(*a, **k)
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", nan_empty)


@pytest.mark.parametrize("run,device,case,form,dtype", _params())
def test_matches_reference(run, device, case, form, dtype, poisoned_outputs):
    x = make_inputs(case, form, dtype, device)
    want = oracle(case, x)
    out = run(x, case)
    assert torch.isfinite(out).all()
    check(case, x, out, want)


@pytest.mark.parametrize("run", [pytest.param(_op, id="op"), pytest.param(_triton, id="triton",
                                 marks=[pytest.mark.gpu] if HAS_CUDA else [])])
@pytest.mark.parametrize("form", FORMS)
def test_unrouted_experts_are_never_read(run, form):
    """NaN in the weight scales (and activation scales) of experts no token picks stays out of out."""
    case = Case("unrouted", 5, 64, 8, 32, 2)
    device = "cuda" if run is _triton and HAS_CUDA else "cpu"
    x = make_inputs(case, form, torch.float32, device, seed=3)
    x["router_logits"][:, 4:] = -30.0
    want = oracle(case, x)
    for name in ("gate_up_scale", "down_scale", "gate_up_input_scale", "down_input_scale"):
        if x.get(name) is not None:
            x[name][4:] = float("nan")
    out = run(x, case)
    assert torch.isfinite(out).all()
    check(case, x, out, want)
