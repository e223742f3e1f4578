"""Partial rotary embedding (gdn_export.ops.rotary): the PyTorch form and the fused kernel against a
float64 oracle (ids `impl-case-dtype`), the kernel against the PyTorch form, where the op runs, and
the attention layer through the kernel (forced on the CPU through Triton's interpreter).

The oracle rotates in float64 with each product and the sum rounded to x's dtype, as the contract
says; out is held per element to one ulp of the dtype (three in bf16 under the interpreter, which
casts to bf16 by truncation; 1e-6 in fp32) of its scale, |x cos| + |r sin| where it rotates (a sum
that cancels keeps its operands' rounding). x comes as the transposed
[B, T, H, D] view the attention layers pass (or contiguous), every pass-through channel must be
copied bit for bit, and cos / sin are the model's tables at odd positions."""

from __future__ import annotations

import pytest
import torch

from gdn_export.modules.rotary import RotaryEmbedding
from gdn_export.ops import backends, rotary as op, use_backend
from tests.ops.impl import HAS_CUDA, Impl, params, poisoned, runnable

# the kernel itself on a GPU (`pytest -m gpu` runs it there); Triton's interpreter on a CPU
GPU_WHEN_PRESENT = pytest.mark.gpu if HAS_CUDA else (lambda test: test)
ALL = (torch.float32, torch.bfloat16, torch.float16)


class Case:
    def __init__(self, name, B, H, T, D, R, transposed=True, tags=("small",)):
        self.name, self.B, self.H, self.T, self.D, self.R = name, B, H, T, D, R
        self.transposed, self.tags, self.dtypes = transposed, frozenset(tags), ALL

    @property
    def cost(self):
        return self.B * self.H * self.T * self.D


CASES = [
    Case("decode-B1-H16-D256-R64", 1, 16, 1, 256, 64),
    Case("decode-B3-H2-D256-R64", 3, 2, 1, 256, 64),
    Case("prefill-B2-H4-T33-D128-R32", 2, 4, 33, 128, 32),
    Case("full-rotary-D64", 1, 3, 9, 64, 64),
    Case("contiguous-H2-T5-D48-R16", 2, 2, 5, 48, 16, transposed=False),
    Case("odd-D10-R2", 1, 1, 7, 10, 2),
    Case("no-tokens", 1, 2, 0, 32, 8),
    Case("prefill-T4096-H16-D256-R64", 1, 16, 4096, 256, 64, tags=("gpu",)),
]


def make_inputs(case, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    B, H, T, D = case.B, case.H, case.T, case.D
    if case.transposed:
        x = (torch.randn(B, T, H, D, generator=gen) * 3).to(dtype).to(device).transpose(1, 2)
    else:
        x = (torch.randn(B, H, T, D, generator=gen) * 3).to(dtype).to(device)
    positions = torch.randint(0, 50_000, (B, T), generator=gen).to(device)
    cos, sin = RotaryEmbedding(case.R, 10_000_000.0)(positions, dtype)
    return {"x": x, "cos": cos, "sin": sin}


def _parts(inp):
    """(x, rotate_half(x[:R]), cos, sin) in float64 on the CPU, cos / sin over the heads."""
    x, cos, sin = inp["x"].double().cpu(), inp["cos"][:, None].double().cpu(), inp["sin"][:, None].double().cpu()
    R = cos.shape[-1]
    return x, torch.cat((-x[..., R // 2:R], x[..., :R // 2]), -1), cos, sin


def oracle(inp):
    dtype = inp["x"].dtype
    x, rot, cos, sin = _parts(inp)
    R = cos.shape[-1]
    first = (x[..., :R] * cos).to(dtype).double()
    second = (rot * sin).to(dtype).double()
    return torch.cat(((first + second).to(dtype).double(), x[..., R:]), -1)


def scale(inp):
    """Each element's error scale: |x cos| + |r sin| where it rotates (a sum that cancels keeps its
    operands' rounding), |x| where it passes through."""
    x, rot, cos, sin = _parts(inp)
    R = cos.shape[-1]
    return torch.cat(((x[..., :R] * cos).abs() + (rot * sin).abs(), x[..., R:].abs()), -1)


def within(got, want, inp, rel):
    """The largest |got - want| over its bound rel x scale + the dtype's smallest normal."""
    if want.numel() == 0:
        return 0.0
    bound = scale(inp) * rel + torch.finfo(inp["x"].dtype).tiny
    return ((got.double().cpu() - want.double().cpu()).abs() / bound).max().item()


def check(out, inp, dtype, interpreted):
    want = oracle(inp)
    x = inp["x"]
    assert out.dtype == dtype and out.shape == x.shape and out.is_contiguous()
    got = out.double().cpu()
    assert not torch.isnan(got).any(), "NaN (an element left unwritten?)"
    R = inp["cos"].shape[-1]
    assert torch.equal(got[..., R:], x.double().cpu()[..., R:]), "the channels past R must pass through as is"
    ulps = 3 if (interpreted and dtype == torch.bfloat16) else 1
    rel = {torch.float32: 1e-6, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}[dtype] * ulps
    worst = within(got, want, inp, rel)
    assert worst <= 1.0, f"an element is {worst:.2f} x its bound from the oracle ({dtype})"


def _torch(inp):
    return op.apply_rotary_torch(inp["x"], inp["cos"], inp["sin"]).contiguous()


def _op(inp):
    with use_backend("triton"):
        return op.apply_rotary(inp["x"], inp["cos"], inp["sin"]).contiguous()


def _triton(inp):
    out = poisoned(inp["x"].shape, inp["x"].dtype, inp["x"].device)
    y = op.apply_rotary_fused(inp["x"], inp["cos"], inp["sin"], out=out)
    assert y.data_ptr() == out.data_ptr()
    return y


IMPLS = [Impl("torch-form", "reference", _torch), Impl("op-triton-backend", "triton", _op),
         Impl("triton", "triton", _triton)]
RUN = runnable(CASES)


@pytest.mark.parametrize("impl,case,dtype", params(IMPLS, RUN, None, cost=lambda c: c.cost // 64))
def test_matches_float64_oracle(impl, case, dtype):
    impl.skip_if_unavailable()
    inp = make_inputs(case, dtype, impl.device)
    before = inp["x"].clone()
    check(impl.run(inp), inp, dtype, impl.interpreted)
    assert torch.equal(inp["x"], before), "x was modified"


@pytest.mark.parametrize("impl", [pytest.param(i, id=i.name, marks=i.marks()) for i in IMPLS if i.name == "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_fused_equals_pytorch_form(impl, dtype):
    """The kernel rounds as the PyTorch form does: the rotated channels bit for bit (>= 99%: a skipped
    intermediate rounding leaves ~80% in fp16; bf16 under the interpreter, which truncates, is held
    to the bound alone), fresh inputs per seed."""
    impl.skip_if_unavailable()
    for seed in range(3):
        inp = make_inputs(CASES[2], dtype, impl.device, seed=seed)
        fused, torch_form = impl.run(inp).double(), _torch(inp).double()
        rel = {torch.float32: 1e-6, torch.float16: 2.0 ** -9, torch.bfloat16: 2.0 ** -6}[dtype]
        rel *= 2 if (dtype == torch.bfloat16 and impl.interpreted) else 1  # three truncations
        assert within(fused, torch_form, inp, rel) <= 1.0
        if dtype != torch.bfloat16 or not impl.interpreted:
            R = inp["cos"].shape[-1]
            assert (fused == torch_form)[..., :R].double().mean() >= 0.99


def test_cpu_tensors_and_other_dtypes_take_the_pytorch_form(monkeypatch):
    inp = make_inputs(CASES[2], torch.bfloat16, "cpu")
    with use_backend("triton"):
        assert not op.fused_ready(inp["x"], inp["cos"], inp["sin"])
        monkeypatch.setattr(backends, "on_gpu", lambda t: True)
        assert op.fused_ready(inp["x"], inp["cos"], inp["sin"])
        assert not op.fused_ready(inp["x"], inp["cos"].float(), inp["sin"].float())  # fp32 tables promote
        assert not op.fused_ready(inp["x"], inp["cos"][:1], inp["sin"][:1])  # broadcast batch


@GPU_WHEN_PRESENT
@pytest.mark.parametrize("family", ["qwen3_5", "olmo_hybrid"])
def test_attention_layer_through_the_fused_kernel(monkeypatch, family):
    """A model's q / k rotations through the kernel give its PyTorch form's logits (bf16, a ragged
    prefill's positions), and the kernel ran for q and k of every attention layer."""
    from tests.ops.glue_model import logits_through_one_kernel, relative_rms

    want, got, calls, model = logits_through_one_kernel(monkeypatch, op, "apply_rotary_fused", family)
    layers = sum(1 for kind in model.config.layer_kinds if kind != "linear_attention")
    assert len(calls) == 2 * layers
    # bf16 logits through a whole model: relative RMS (3-4e-3 under the interpreter, whose casts truncate)
    err = relative_rms(got, want)
    assert err <= 1e-2, err


def test_fused_entry_refuses_what_breaks_the_contract():
    from tests.triton_interpreter import interpret_without_gpu

    interpret_without_gpu()
    inp = make_inputs(CASES[2], torch.float32, "cpu")
    with pytest.raises(ValueError, match="x must be"):
        op.apply_rotary_fused(inp["x"][0], inp["cos"], inp["sin"])
    with pytest.raises(ValueError, match="cos and sin must be \\[B, T, R\\]"):
        op.apply_rotary_fused(inp["x"], inp["cos"][..., :3], inp["sin"][..., :3])
    with pytest.raises(ValueError, match="must be x's"):
        op.apply_rotary_fused(inp["x"], inp["cos"].half(), inp["sin"].half())
