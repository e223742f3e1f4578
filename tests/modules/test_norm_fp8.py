"""The FP8 x pass inside the norms: a decoder norm (`add_for`) or the GDN output norm
(`GatedRMSNorm.project`) whose output goes to an FP8 projection (per-tensor input scale) at prefill
rows writes the output's FP8 form in the same kernel, and the projection's GEMM reads it
(gdn_export.modules.norm). Held here: the norm output and the sum are the plain kernel's; the
projections give the unfused path's outputs (bit for bit on a GPU, where both reach cuBLASLt with
the same FP8 x; within the FP8 contract tolerance on the CPU, where the unfused fp8_linear is the
fp32 reference); the FP8 part of a mixed group (Qwen3.5's q|k|v|z beside its 16-bit b|a) takes the
offer and the 16-bit part reads the 16-bit output; unequal input scales leave the other members to
their own x pass; an offer goes only to the same tensor and the same scale, once; where the path is
not ready (the CPU as it is, decode rows) nothing changes. On a CPU the kernels run under
TRITON_INTERPRET=1 with the GPU-only gates opened; with a GPU, on it, gates as they are."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gdn_export.modules.norm as norm_module
import gdn_export.modules.quant_linear as quant_module
import gdn_export.ops.quant_linear as op
from gdn_export.modules.fused_linear import fuse_linears
from gdn_export.modules.norm import GatedRMSNorm, RMSNorm, ZeroCenteredRMSNorm
from gdn_export.modules.quant_linear import Fp8Linear
from gdn_export.ops import backends
from tests.modules.test_quant_linear_modules import Siblings
from tests.ops.quant_linear.cases import TOL, fp8_weights, rel_rms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.gpu if DEVICE == "cuda" else []


def fp8_linear(K, N, gen, scale):
    m = Fp8Linear(K, N)
    m.weight, m.weight_scale = fp8_weights(N, K, gen)
    m.input_scale.fill_(scale)
    return m


@pytest.fixture
def ready(monkeypatch):
    """The fused eager kernels' backend; on a CPU also their GPU-only gates opened. Returns the list of
    `fp8_linear_quantized` calls (the projections that read a prequantized x)."""
    monkeypatch.setattr(backends, "current_name", lambda: "triton")
    if DEVICE == "cpu":
        monkeypatch.setattr(backends, "on_gpu", lambda t: True)
        monkeypatch.setattr(norm_module, "prequantized_ready", lambda *a: True)
    calls = []
    for module in (norm_module, quant_module):
        real = module.fp8_linear_quantized
        monkeypatch.setattr(module, "fp8_linear_quantized",
                            lambda *a, real=real, **k: calls.append(a[3].shape) or real(*a, **k))
    op._OFFER.clear()
    yield calls
    op._OFFER.clear()


def _close(got, want, dtype):
    assert got.shape == want.shape and got.dtype == want.dtype
    if DEVICE == "cuda":
        assert torch.equal(got, want)
    else:
        assert rel_rms(got, want) <= TOL[dtype]


# members: (kind, out features, input scale); "16" an nn.Linear in the model dtype
GROUPS = [
    pytest.param([("fp8", 96, 0.05), ("fp8", 32, 0.05)], [(96 + 32, 2)], id="fp8-gate-up"),
    pytest.param([("fp8", 64, 0.05), ("fp8", 48, 0.05), ("16", 16, None), ("16", 16, None)], [(112, 4)],
                 id="fp8-qkvz-then-16bit-ba"),
    pytest.param([("fp8", 64, 0.05), ("fp8", 48, 0.08)], [(64, 2)], id="unequal-input-scales"),
]


@pytest.mark.parametrize("members,takes", GROUPS)
@pytest.mark.parametrize("norm_cls", [ZeroCenteredRMSNorm, RMSNorm], ids=["zero-centred", "plain"])
@pytest.mark.parametrize("residual", [True, False], ids=["add", "first-layer"])
def test_decoder_norm_feeds_the_first_fp8_projection(ready, members, takes, norm_cls, residual):
    dtype, H = torch.bfloat16, 64
    gen = torch.Generator().manual_seed(len(members) + H)
    linears = [fp8_linear(H, n, gen, s) if kind == "fp8" else nn.Linear(H, n, bias=False).to(dtype)
               for kind, n, s in members]
    block = Siblings(linears).to(DEVICE)
    fuse_linears(block)
    norm = norm_cls(H)
    with torch.no_grad():
        norm.weight.normal_(0.0 if norm_cls is ZeroCenteredRMSNorm else 1.0, 0.3, generator=gen)
    norm = norm.to(dtype).to(DEVICE)
    x = (torch.randn(2, 40, H, generator=gen) * 3).to(dtype).to(DEVICE)
    pending = (torch.randn(2, 40, H, generator=gen)).to(dtype).to(DEVICE) if residual else None
    with torch.no_grad():
        want_s, want_h = norm.add(x, pending) if residual else (x, norm(x))
        want = torch.cat(block(want_h), -1)
        assert not ready  # the plain path: no offer, no prequantized GEMM
        s, h = norm.add_for(x, pending, block)
        got = torch.cat(block(h), -1)
    assert torch.equal(h, want_h) and torch.equal(s, want_s)
    assert [tuple(shape) for shape in ready] == [(N, H) for N, _ in takes[:1]]
    assert not op._OFFER  # taken
    _close(got, want, dtype)


def test_gdn_output_norm_feeds_its_fp8_projection(ready):
    dtype, Hv, Dv, N = torch.bfloat16, 3, 64, 48
    gen = torch.Generator().manual_seed(3)
    norm = GatedRMSNorm(Dv).to(dtype).to(DEVICE)
    proj = fp8_linear(Hv * Dv, N, gen, 0.02).to(DEVICE)
    both = (torch.randn(2, 37, Hv, 2 * Dv, generator=gen) * 2).to(dtype).to(DEVICE)
    o, z = both[..., :Dv], both[..., Dv:]  # strided slices, as the GDN's z and o come
    with torch.no_grad():
        want = proj(norm(o, z).reshape(2, 37, Hv * Dv))
        assert not ready
        got = norm.project(o, z, proj)
    assert [tuple(s) for s in ready] == [(N, Hv * Dv)]
    _close(got, want, dtype)


def test_nothing_changes_where_the_path_is_not_ready(monkeypatch):
    """Decode rows (the skinny GEMM quantizes in its tiles), or the CPU with its gates as they are."""
    monkeypatch.setattr(backends, "current_name", lambda: "triton")
    gen = torch.Generator().manual_seed(0)
    H = 64
    block = Siblings([fp8_linear(H, 32, gen, 0.05), fp8_linear(H, 32, gen, 0.05)]).to(DEVICE)
    fuse_linears(block)
    norm = ZeroCenteredRMSNorm(H).to(torch.bfloat16).to(DEVICE)
    proj = fp8_linear(3 * 64, 32, gen, 0.05).to(DEVICE)
    gnorm = GatedRMSNorm(64).to(torch.bfloat16).to(DEVICE)
    rows = [1, 64] if DEVICE == "cuda" else [1, 80]
    for T in rows:
        x = torch.randn(1, T, H, generator=gen).to(torch.bfloat16).to(DEVICE)
        o = torch.randn(1, T, 3, 64, generator=gen).to(torch.bfloat16).to(DEVICE)
        with torch.no_grad():
            s, h = norm.add_for(x, x, block)
            assert not op._OFFER
            want_s, want_h = norm.add(x, x)
            assert torch.equal(s, want_s) and torch.equal(h, want_h)
            assert torch.equal(gnorm.project(o, o, proj), proj(gnorm(o, o).reshape(1, T, 192)))


def test_an_offer_goes_to_the_same_tensor_and_scale_once():
    x, other = torch.ones(2, 4), torch.ones(2, 4)
    xq, rs = torch.zeros(2, 4), torch.ones(2, 1)
    scale, other_scale = torch.tensor(0.5), torch.tensor(0.5)
    op.offer_quantized(x, xq, rs, scale)
    assert op.take_quantized(other, scale) is None and op._OFFER  # another tensor: kept
    assert op.take_quantized(x, scale) == (xq, rs)
    assert op.take_quantized(x, scale) is None  # once
    op.offer_quantized(x, xq, rs, scale)
    assert op.take_quantized(x, other_scale) is None and not op._OFFER  # an equal scale is not the scale
    op.offer_quantized(x, xq, rs, scale)
    op.offer_quantized(other, xq, rs, scale)  # a later offer replaces one nobody took
    assert op.take_quantized(x, scale) is None
    op._OFFER.clear()
