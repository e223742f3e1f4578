"""The residual add fused into the norm after it (`add_rms_norm`: s = x + residual, y = rms_norm(s)),
held by every implementation on decoder-shaped cases: ids are `impl-case-dtype`.

s must be x + residual rounded once to x's dtype: exactly PyTorch's add wherever the kernel's bf16 /
fp16 casts round (the GPU; fp32 everywhere), within one ulp where Triton's interpreter truncates them.
y must match the float64 oracle of the norm of that s at the bounds of cases.py. Inputs are
model-like (a residual stream with outlier channels, a block output of another scale) or normal
draws, x and residual as strided views where a case says so; outputs are NaN-poisoned."""

from __future__ import annotations

import pytest
import torch

import gdn_export.ops.rms_norm as op
from gdn_export.ops import backends, use_backend
from gdn_export.ops.rms_norm import naive
from tests.ops.impl import HAS_CUDA, Impl, params, poisoned, runnable
from tests.ops.rms_norm.cases import Case, check, oracle

GPU_WHEN_PRESENT = pytest.mark.gpu if HAS_CUDA else (lambda test: test)


# view "interleaved": x and residual are halves of wider tensors (strided rows)
CASES = [
    Case("decode-hidden2048", (1, 1), 2048, kind="zero"),
    Case("decode-B5-hidden1024-plain", (5, 1), 1024),
    Case("prefill-B2-T37-hidden256", (2, 37), 256, kind="zero"),
    Case("strided-B3-T4-D96", (3, 4), 96, kind="zero", view="interleaved"),
    Case("odd-D1", (4,), 1, model_like=False),
    Case("odd-D130-plain-normal", (7,), 130, model_like=False),
    Case("no-rows", (0, 3), 64, kind="zero"),
    Case("prefill-T4096-hidden2048", (1, 4096), 2048, kind="zero", tags=frozenset({"gpu"})),
]


def make_inputs(case: Case, dtype: torch.dtype, device: str, seed: int = 0) -> dict:
    """{"x", "residual", "weight", "eps", "zero_centered"} on `device`."""
    g = torch.Generator().manual_seed(seed)
    width = 2 if case.view == "interleaved" else 1
    x = torch.randn(*case.lead, width * case.D, generator=g)
    r = torch.randn(*case.lead, width * case.D, generator=g)
    if case.model_like:
        x[..., : case.D: max(1, case.D // 3)] *= 30.0  # the residual stream's outlier channels
        r *= 0.2
    zero = case.kind == "zero"
    w = torch.randn(case.D, generator=g) * 0.3 + (0.0 if zero else 1.0)
    x, r = x.to(dtype).to(device), r.to(dtype).to(device)
    if case.view == "interleaved":
        x, r = x[..., : case.D], r[..., case.D:]
    return {"x": x, "residual": r, "weight": w.to(dtype).to(device), "eps": case.eps, "zero_centered": zero}


def _naive(inp):
    return naive.add_rms_norm(inp["x"], inp["residual"], inp["weight"], inp["eps"], inp["zero_centered"])


def _op(inp):
    """The public op with the triton backend active: the kernel on a GPU, the PyTorch form on a CPU."""
    with use_backend("triton"):
        return op.add_rms_norm(inp["x"], inp["residual"], inp["weight"], inp["eps"], inp["zero_centered"])


def _triton(inp):
    x = inp["x"]
    out, out_sum = poisoned(x.shape, x.dtype, x.device), poisoned(x.shape, x.dtype, x.device)
    s, y = op.add_rms_norm_fused(x, inp["residual"], inp["weight"], inp["eps"], inp["zero_centered"], out=out,
                                 out_sum=out_sum)
    assert y.data_ptr() == out.data_ptr() and s.data_ptr() == out_sum.data_ptr()
    return s, y


IMPLS = [
    Impl("reference", "reference", _naive),
    Impl("op-triton-backend", "triton", _op),
    Impl("triton", "triton", _triton),
]
RUN = runnable(CASES)


def check_sum(s: torch.Tensor, inp: dict, exact: bool) -> None:
    """s against PyTorch's x + residual: equal, or (not exact: the interpreter's truncating casts) within
    one ulp of x's dtype."""
    want = inp["x"] + inp["residual"]
    assert s.dtype == want.dtype and s.shape == want.shape
    assert not torch.isnan(s).any(), "NaN in s (an element left unwritten?)"
    if exact or s.dtype == torch.float32:
        assert torch.equal(s, want), "s is not PyTorch's x + residual"
    else:
        ulp = torch.finfo(s.dtype).eps * want.double().abs() + torch.finfo(s.dtype).tiny
        assert ((s.double() - want.double()).abs() <= ulp).all(), "s is more than one ulp from x + residual"


@pytest.mark.parametrize("impl,case,dtype", params(IMPLS, RUN, None, cost=lambda c: c.cost // 64))
def test_matches_float64_oracle(impl, case, dtype):
    impl.skip_if_unavailable()
    inp = make_inputs(case, dtype, impl.device)
    before = (inp["x"].clone(), inp["residual"].clone())
    s, y = impl.run(inp)
    check_sum(s, inp, exact=not impl.interpreted)
    check(y, oracle({"x": s, "weight": inp["weight"], "gate": None, "eps": inp["eps"],
                     "zero_centered": inp["zero_centered"]}), dtype, inp["x"].shape)
    assert torch.equal(inp["x"], before[0]) and torch.equal(inp["residual"], before[1]), "an input was modified"


@GPU_WHEN_PRESENT
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_norm_modules_add_through_the_kernel(monkeypatch, dtype):
    """ZeroCenteredRMSNorm.add / RMSNorm.add take the kernel where the device check passes (forced on a
    CPU, through the interpreter) and equal the add followed by the module itself."""
    from gdn_export.modules.norm import RMSNorm, ZeroCenteredRMSNorm
    from tests.triton_interpreter import interpret_without_gpu

    interpret_without_gpu()
    device = "cuda" if HAS_CUDA else "cpu"
    if not HAS_CUDA:
        monkeypatch.setattr(backends, "on_gpu", lambda x: True)
    calls = []
    fused = op.add_rms_norm_fused
    monkeypatch.setattr(op, "add_rms_norm_fused", lambda *a, **k: calls.append(1) or fused(*a, **k))
    torch.manual_seed(0)
    for module in (ZeroCenteredRMSNorm, RMSNorm):
        norm = module(40, eps=1e-5)
        with torch.no_grad():
            norm.weight.add_(torch.randn(40) * 0.3)
        norm = norm.to(dtype).to(device)
        x = (torch.randn(2, 3, 40) * 5).to(dtype).to(device)
        r = torch.randn(2, 3, 40).to(dtype).to(device)
        with use_backend("triton"), torch.no_grad():
            s, y = norm.add(x, r)
        check_sum(s, {"x": x, "residual": r}, exact=HAS_CUDA)
        check(y, oracle({"x": s, "weight": norm.weight.detach(), "gate": None, "eps": 1e-5,
                         "zero_centered": module is ZeroCenteredRMSNorm}), dtype, x.shape)
    assert calls == [1, 1]


def test_fused_entry_refuses_what_breaks_the_contract():
    from tests.triton_interpreter import interpret_without_gpu

    interpret_without_gpu()
    x, w = torch.randn(2, 8), torch.randn(8)
    with pytest.raises(ValueError, match="residual must be"):
        op.add_rms_norm_fused(x, torch.randn(2, 8, dtype=torch.float16), w, 1e-6)
    with pytest.raises(ValueError, match="residual must be"):
        op.add_rms_norm_fused(x, torch.randn(2, 7), w, 1e-6)
    with pytest.raises(ValueError, match="weight must be"):
        op.add_rms_norm_fused(x, torch.randn(2, 8), torch.randn(7), 1e-6)
    with pytest.raises(ValueError, match="out must be"):
        op.add_rms_norm_fused(x, torch.randn(2, 8), w, 1e-6, out_sum=torch.empty(2, 16)[:, :8])


def test_mismatched_residual_takes_the_pytorch_form(monkeypatch):
    """A residual of another dtype than x is added as PyTorch adds it (type promotion), never sent to
    the kernel."""
    monkeypatch.setattr(backends, "on_gpu", lambda x: True)
    monkeypatch.setattr(op, "add_rms_norm_fused", lambda *a, **k: pytest.fail("the kernel ran"))
    x, r, w = torch.randn(3, 8, dtype=torch.bfloat16), torch.randn(3, 8), torch.randn(8)
    with use_backend("triton"):
        s, y = op.add_rms_norm(x, r, w, 1e-6)
    assert s.dtype == torch.float32 and torch.equal(s, x + r)
