"""silu(gate) * up: every implementation against the float64 oracle (ids `impl-case-dtype`), the
fused kernel against the PyTorch form, and where the op runs (the fused path forced on the CPU
through Triton's interpreter)."""

import pytest
import torch

import gdn_export.ops.silu_mul as op
from gdn_export.ops import backends, use_backend
from tests.ops.impl import HAS_CUDA, Impl, params, poisoned, runnable
from tests.ops.silu_mul.cases import CASES, check, make_inputs, oracle

# the kernel itself on a GPU (`pytest -m gpu` runs it there); Triton's interpreter on a CPU
GPU_WHEN_PRESENT = pytest.mark.gpu if HAS_CUDA else (lambda test: test)


def _naive(inp):
    from gdn_export.ops.silu_mul.naive import silu_mul

    return silu_mul(inp["gate"], inp["up"])


def _op(inp):
    with use_backend("triton"):
        return op.silu_mul(inp["gate"], inp["up"])


def _triton(inp):
    out = poisoned(inp["gate"].shape, inp["gate"].dtype, inp["gate"].device)
    y = op.silu_mul_fused(inp["gate"], inp["up"], out=out)
    assert y.data_ptr() == out.data_ptr()
    return y


IMPLS = [Impl("reference", "reference", _naive), Impl("op-triton-backend", "triton", _op),
         Impl("triton", "triton", _triton)]
RUN = runnable(CASES)


@pytest.mark.parametrize("impl,case,dtype", params(IMPLS, RUN, None, cost=lambda c: c.cost // 64))
def test_matches_float64_oracle(impl, case, dtype):
    impl.skip_if_unavailable()
    inp = make_inputs(case, dtype, impl.device)
    before = inp["gate"].clone(), inp["up"].clone()
    out = impl.run(inp)
    check(out, oracle(inp), dtype, inp["gate"].shape)
    assert torch.equal(inp["gate"], before[0]) and torch.equal(inp["up"], before[1]), "an input was modified"


@pytest.mark.parametrize("impl", [pytest.param(i, id=i.name, marks=i.marks()) for i in IMPLS if i.name == "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_fused_equals_pytorch_form(impl, dtype):
    """The kernel and F.silu(gate) * up (the graph's form) round the same way: within the two
    roundings' slack per element (1e-6 relative in fp32, two ulps in 16 bits) and mostly equal bit
    for bit (>= 99% in 16 bits; >= 80% in fp32, where the two fp32 silus differ in their last bit),
    fresh inputs per seed. Triton's
    interpreter casts to bf16 by truncation, not to nearest: bf16 is held to the bound alone there."""
    from gdn_export.ops.silu_mul.naive import silu_mul

    impl.skip_if_unavailable()
    for seed in range(3):
        inp = make_inputs(CASES[2], dtype, impl.device, seed=seed)
        fused, torch_form = impl.run(inp).double(), silu_mul(inp["gate"], inp["up"]).double()
        rel = {torch.float32: 1e-6, torch.bfloat16: 2.0 ** -6, torch.float16: 2.0 ** -9}[dtype]
        assert ((fused - torch_form).abs() <= torch_form.abs() * rel + 1e-30).all()
        if dtype != torch.bfloat16 or not impl.interpreted:
            assert (fused == torch_form).double().mean() >= (0.8 if dtype == torch.float32 else 0.99)


def test_cpu_tensors_take_the_pytorch_form():
    with use_backend("triton"):
        assert not op.fused_ready(torch.randn(2, 4), torch.randn(2, 4))


@GPU_WHEN_PRESENT
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mlp_through_the_fused_kernel(monkeypatch, dtype):
    """SwiGLUMLP with fused gate / up projections (the runtime's fuse_linears) takes the kernel on
    the halves of the one GEMM's output where fused_eager's device check passes, and equals its
    PyTorch form."""
    from gdn_export.modules.fused_linear import fuse_linears
    from gdn_export.modules.mlp import SwiGLUMLP
    from tests.triton_interpreter import interpret_without_gpu

    interpret_without_gpu()
    device = "cuda" if HAS_CUDA else "cpu"
    torch.manual_seed(0)
    mlp = SwiGLUMLP(24, 40).to(dtype).to(device)
    assert fuse_linears(mlp) == 1
    x = torch.randn(2, 5, 24).to(dtype).to(device)
    mlp.requires_grad_(False)  # as the loaders leave a model
    with use_backend("reference"):
        want = mlp(x)
    with use_backend("triton"):
        calls = []
        fused = op.silu_mul_fused
        if not HAS_CUDA:
            monkeypatch.setattr(backends, "on_gpu", lambda t: True)
        monkeypatch.setattr(op, "silu_mul_fused", lambda *a, **k: calls.append(1) or fused(*a, **k))
        got = mlp(x)
    assert calls == [1]
    # after down_proj's sums: relative RMS over the output (elements near 0 carry the products' rounding)
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert err <= (1e-6 if dtype == torch.float32 else 1e-2), err


def test_fused_entry_refuses_what_breaks_the_contract():
    from tests.triton_interpreter import interpret_without_gpu

    interpret_without_gpu()
    g = torch.randn(2, 8)
    with pytest.raises(ValueError, match="up must be"):
        op.silu_mul_fused(g, torch.randn(2, 7))
    with pytest.raises(ValueError, match="up must be"):
        op.silu_mul_fused(g, torch.randn(2, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="gate must be"):
        op.silu_mul_fused(g.to(torch.int32), g.to(torch.int32))
    with pytest.raises(ValueError, match="out must be"):
        op.silu_mul_fused(g, g, out=torch.empty(2, 16)[:, :8])


def test_gradients_keep_the_pytorch_form(monkeypatch):
    """An input that requires grad passes the kernel (no backward) over; the gradient flows."""
    monkeypatch.setattr(backends, "on_gpu", lambda t: True)
    monkeypatch.setattr(op, "silu_mul_fused", lambda *a, **k: pytest.fail("the kernel ran under autograd"))
    gate = torch.randn(3, 8, requires_grad=True)
    with use_backend("triton"):
        op.silu_mul(gate, torch.randn(3, 8)).sum().backward()
    assert gate.grad is not None and gate.grad.abs().sum() > 0
