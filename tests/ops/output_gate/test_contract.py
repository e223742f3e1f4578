"""The gated attention's output gate (gdn_export.ops.output_gate): every implementation against the
float64 oracle (ids `impl-case-dtype`), the kernel against the PyTorch form, and where the op runs (the
fused path forced on the CPU through Triton's interpreter).

The oracle: sigmoid(gate) in float64 rounded once to the dtype, times o, rounded once
(elementwise_check.round_once); out within two ulps of it (fp16 2^-9, bf16 2^-6 relative plus the
dtype's smallest normal; fp32 1e-6) and within a relative RMS of 1e-6 / 5e-4 / 4e-3. Two: the
contract's sigmoid is PyTorch's fp32 one, whose last-bit error can put it on the other side of a
16-bit rounding midpoint than the exact value, one ulp of the rounded sigmoid, which the product
carries (fp16 at [4096, 16 x 256]: 3 elements at 1.29 ulps). o comes as the attention gives it
([B, H, T, D], contiguous or a transposed view) and the gate as the per-head half of the q
projection's output (a strided [B, T, H, D] view); outputs are NaN-poisoned."""

from __future__ import annotations

import pytest
import torch

import gdn_export.ops.output_gate as op
from gdn_export.ops import backends, use_backend
from tests.ops.elementwise_check import check_elementwise, round_once
from tests.ops.impl import HAS_CUDA, Impl, params, poisoned, runnable

GPU_WHEN_PRESENT = pytest.mark.gpu if HAS_CUDA else (lambda test: test)
ALL = (torch.float32, torch.bfloat16, torch.float16)
REL = {torch.float32: 1e-6, torch.float16: 2.0 ** -9, torch.bfloat16: 2.0 ** -6}
RMS = {torch.float32: 1e-6, torch.float16: 5e-4, torch.bfloat16: 4e-3}


class Case:
    def __init__(self, name, B, H, T, D, o_transposed=False, tags=("small",)):
        self.name, self.B, self.H, self.T, self.D = name, B, H, T, D
        self.o_transposed, self.tags, self.dtypes = o_transposed, frozenset(tags), ALL


CASES = [
    Case("decode-B1-H16-D256", 1, 16, 1, 256),
    Case("decode-B3-H2-D64", 3, 2, 1, 64),
    Case("prefill-B2-H4-T33-D128", 2, 4, 33, 128),
    Case("o-transposed-B2-H3-T5-D48", 2, 3, 5, 48, o_transposed=True),
    Case("odd-D10", 1, 1, 7, 10),
    Case("no-tokens", 1, 2, 0, 32),
    Case("prefill-T4096-H16-D256", 1, 16, 4096, 256, tags=("gpu",)),
]
RUN = runnable(CASES)


def make_inputs(case, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    B, H, T, D = case.B, case.H, case.T, case.D
    if case.o_transposed:  # [B, T, H, D] storage seen as [B, H, T, D]
        o = (torch.randn(B, T, H, D, generator=gen) * 2).to(dtype).to(device).transpose(1, 2)
    else:
        o = (torch.randn(B, H, T, D, generator=gen) * 2).to(dtype).to(device)
    q_and_gate = (torch.randn(B, T, H, 2 * D, generator=gen) * 4).to(dtype).to(device)
    return {"o": o, "gate": q_and_gate[..., D:]}  # the gate half of each head: a strided view


def oracle(inp):
    o, gate = inp["o"], inp["gate"]
    B, H, T, D = o.shape
    sig = round_once(torch.sigmoid(gate.double().cpu()), o.dtype).reshape(B, T, H * D)
    return round_once(o.double().cpu().transpose(1, 2).reshape(B, T, H * D) * sig, o.dtype)


def _naive(inp):
    from gdn_export.ops.output_gate.naive import output_gate

    return output_gate(inp["o"], inp["gate"])


def _op(inp):
    with use_backend("triton"):
        return op.output_gate(inp["o"], inp["gate"])


def _triton(inp):
    B, H, T, D = inp["o"].shape
    out = poisoned((B, T, H * D), inp["o"].dtype, inp["o"].device)
    y = op.output_gate_fused(inp["o"], inp["gate"], out=out)
    assert y.data_ptr() == out.data_ptr()
    return y


IMPLS = [Impl("reference", "reference", _naive), Impl("op-triton-backend", "triton", _op),
         Impl("triton", "triton", _triton)]


@pytest.mark.parametrize("impl,case,dtype", params(IMPLS, RUN, None, cost=lambda c: c.B * c.H * c.T * c.D // 64))
def test_matches_float64_oracle(impl, case, dtype):
    impl.skip_if_unavailable()
    inp = make_inputs(case, dtype, impl.device)
    before = inp["o"].clone(), inp["gate"].clone()
    out = impl.run(inp)
    B, H, T, D = inp["o"].shape
    check_elementwise(out, oracle(inp), dtype, (B, T, H * D), REL[dtype], RMS[dtype])
    assert torch.equal(inp["o"], before[0]) and torch.equal(inp["gate"], before[1]), "an input was modified"


@pytest.mark.parametrize("impl", [pytest.param(i, id=i.name, marks=i.marks()) for i in IMPLS if i.name == "triton"])
@pytest.mark.parametrize("dtype", ALL, ids=["fp32", "bf16", "fp16"])
def test_fused_equals_pytorch_form(impl, dtype):
    """The kernel rounds as the PyTorch form does: bit for bit on the GPU (PyTorch's sigmoid is
    1 / (1 + expf(-g)) with IEEE division, as the kernel's); under the interpreter (numpy's exp) within
    one ulp of the dtype, two in bf16 (its casts there truncate)."""
    from gdn_export.ops.output_gate.naive import output_gate

    impl.skip_if_unavailable()
    for seed in range(3):
        inp = make_inputs(CASES[2], dtype, impl.device, seed=seed)
        fused, torch_form = impl.run(inp), output_gate(inp["o"], inp["gate"])
        if impl.interpreted:
            rel = {torch.float32: 1e-6, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -6}[dtype]  # bf16: two truncations
            assert ((fused.double() - torch_form.double()).abs() <= torch_form.double().abs() * rel + 1e-30).all()
        else:
            assert torch.equal(fused, torch_form)


def test_cpu_tensors_and_mismatched_inputs_take_the_pytorch_form(monkeypatch):
    inp = make_inputs(CASES[2], torch.bfloat16, "cpu")
    with use_backend("triton"):
        assert not op.fused_ready(inp["o"], inp["gate"])
        monkeypatch.setattr(backends, "on_gpu", lambda t: True)
        assert op.fused_ready(inp["o"], inp["gate"])
        assert not op.fused_ready(inp["o"], inp["gate"].float())
        B, H, T, D = inp["o"].shape
        assert not op.fused_ready(inp["o"], inp["gate"].reshape(B, T, H * D))


def test_fused_entry_refuses_what_breaks_the_contract():
    from tests.triton_interpreter import interpret_without_gpu

    interpret_without_gpu()
    inp = make_inputs(CASES[2], torch.float32, "cpu")
    o, gate = inp["o"], inp["gate"]
    with pytest.raises(ValueError, match="gate must be"):
        op.output_gate_fused(o, gate[:, :, :3])
    with pytest.raises(ValueError, match="gate must be"):
        op.output_gate_fused(o, gate.half())
    with pytest.raises(ValueError, match="o must be"):
        op.output_gate_fused(o[0], gate)
    B, H, T, D = o.shape
    with pytest.raises(ValueError, match="out must be"):
        op.output_gate_fused(o, gate, out=torch.empty(B, T, H * D * 2)[..., ::2])


def test_gradients_keep_the_pytorch_form(monkeypatch):
    monkeypatch.setattr(backends, "on_gpu", lambda t: True)
    monkeypatch.setattr(op, "output_gate_fused", lambda *a, **k: pytest.fail("the kernel ran under autograd"))
    inp = make_inputs(CASES[2], torch.float32, "cpu")
    o = inp["o"].clone().requires_grad_(True)
    with use_backend("triton"):
        op.output_gate(o, inp["gate"]).sum().backward()
    assert o.grad is not None and o.grad.abs().sum() > 0


@GPU_WHEN_PRESENT
def test_attention_layer_through_the_fused_kernel(monkeypatch):
    """A Qwen3.5 model's gated attention output through the kernel gives its PyTorch form's logits (bf16,
    a ragged prefill), and the kernel ran in every attention layer; the other ops stay on the reference."""
    from tests.ops.glue_model import logits_through_one_kernel, relative_rms

    want, got, calls, model = logits_through_one_kernel(monkeypatch, op, "output_gate_fused", "qwen3_5")
    layers = sum(1 for kind in model.config.layer_kinds if kind != "linear_attention")
    assert len(calls) == layers
    err = relative_rms(got, want)
    assert err <= 1e-2, err
