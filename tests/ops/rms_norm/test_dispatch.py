"""Where RMSNorm runs: the fused kernel only in eager mode on CUDA tensors under a fast backend; the
PyTorch form on the CPU, under the reference backend and in traces. The norm modules take whichever
`rms_norm` picks, strided views included (here the fused path is forced on the CPU, through Triton's
interpreter)."""

import pytest
import torch

import gdn_export.ops.rms_norm as op
from gdn_export.modules.norm import GatedRMSNorm, RMSNorm, ZeroCenteredRMSNorm
from gdn_export.ops import backends, use_backend
from tests.ops.impl import HAS_CUDA, NO_GPU
from tests.ops.rms_norm.cases import check, oracle

# the kernel itself on a GPU (`pytest -m gpu` runs it there); Triton's interpreter on a CPU
GPU_WHEN_PRESENT = pytest.mark.gpu if HAS_CUDA else (lambda test: test)


def test_cpu_tensors_take_the_pytorch_form():
    x, w = torch.randn(3, 8), torch.randn(8)
    with use_backend("triton"):
        assert not op.fused_ready(x, w)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU)
def test_cuda_eager_takes_the_kernel_only_under_a_fast_backend():
    x, w = torch.randn(3, 8, device="cuda", dtype=torch.bfloat16), torch.randn(8, device="cuda")
    with use_backend("triton"):
        assert op.fused_ready(x, w)
        assert op.fused_ready(x, w, torch.randn_like(x))
        assert not op.fused_ready(x, w, torch.randn_like(x, dtype=torch.float32))  # gate dtype
        assert not op.fused_ready(x, torch.randn(9, device="cuda"))  # weight shape
    with use_backend("reference"):
        assert not op.fused_ready(x, w)


@GPU_WHEN_PRESENT
@pytest.mark.parametrize("module,gated", [(ZeroCenteredRMSNorm, False), (RMSNorm, False), (GatedRMSNorm, True)],
                         ids=["zero-centred", "plain", "gated"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_modules_through_the_fused_kernel(monkeypatch, module, gated, dtype):
    """Each norm module (its weight an nn.Parameter) on strided inputs ([B, T, H, 2D] halves, as q
    beside its gate) takes the kernel where fused_ready's device check passes (forced here: CPU
    tensors through the interpreter, the triton backend active; real on a GPU), and equals the float64
    oracle."""
    from tests.triton_interpreter import interpret_without_gpu

    interpret_without_gpu()
    device = "cuda" if HAS_CUDA else "cpu"
    calls = []
    fused = op.rms_norm_fused
    if not HAS_CUDA:
        monkeypatch.setattr(backends, "on_gpu", lambda x: True)
    monkeypatch.setattr(op, "rms_norm_fused", lambda *a, **k: calls.append(1) or fused(*a, **k))
    torch.manual_seed(0)
    D = 48
    norm = module(D, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(D) * 0.5 + (0.0 if module is ZeroCenteredRMSNorm else 1.0))
    norm = norm.to(dtype).to(device)
    both = (torch.randn(2, 5, 3, 2 * D) * 4).to(dtype).to(device)
    x, z = both[..., :D], both[..., D:]
    with use_backend("triton"), torch.no_grad():
        y = norm(x, z) if gated else norm(x)
    assert calls == [1]
    want = oracle({"x": x, "weight": norm.weight.detach(), "gate": z if gated else None, "eps": 1e-5,
                   "zero_centered": module is ZeroCenteredRMSNorm})
    check(y, want, dtype, x.shape)


def test_fused_entry_refuses_what_breaks_the_contract():
    from tests.triton_interpreter import interpret_without_gpu

    interpret_without_gpu()
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="weight must be a float"):
        op.rms_norm_fused(x, torch.randn(7), 1e-6)
    with pytest.raises(ValueError, match="gate must be"):
        op.rms_norm_fused(x, torch.randn(8), 1e-6, gate=torch.randn(2, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="x must be"):
        op.rms_norm_fused(torch.randn(2, 8).to(torch.int32), torch.randn(8), 1e-6)
    with pytest.raises(ValueError, match="out must be"):
        op.rms_norm_fused(x, torch.randn(8), 1e-6, out=torch.empty(2, 16)[:, :8])


def test_gradients_keep_the_pytorch_form(monkeypatch):
    """With grad enabled and a trainable weight the kernel (no backward) is passed over: the PyTorch
    form runs and the weight gets its gradient."""
    monkeypatch.setattr(backends, "on_gpu", lambda x: True)
    monkeypatch.setattr(op, "rms_norm_fused", lambda *a, **k: pytest.fail("the kernel ran under autograd"))
    norm = GatedRMSNorm(8)
    x, z = torch.randn(3, 8), torch.randn(3, 8)
    with use_backend("triton"):
        norm(x, z).sum().backward()
    assert norm.weight.grad is not None and norm.weight.grad.abs().sum() > 0
