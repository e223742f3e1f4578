"""The Gated DeltaNet gates (gdn_export.ops.gated_delta_rule.gating): the PyTorch form and the fused
kernel against a float64 oracle, padded tokens exactly 0, the dispatch, and the layer through the
kernel (forced on the CPU through Triton's interpreter).

Bounds: g (fp32) within 1e-5 relative of the oracle per element (exp and log1p of two libraries);
beta within one ulp of the oracle's sigmoid rounded to b's dtype, times beta_scale (two in bf16
under the interpreter, which casts to bf16 by truncation). Inputs put a + dt_bias across softplus's
three regimes (below -15, the curve, above the threshold 20); a and b are slices of one projection
output, as the layers make them."""

from __future__ import annotations

import pytest
import torch

from gdn_export.ops.gated_delta_rule import gating as op
from gdn_export.ops import backends, use_backend
from tests.ops.impl import HAS_CUDA, Impl, params, poisoned, runnable

ALL = (torch.float32, torch.bfloat16, torch.float16)

# the kernel itself on a GPU (`pytest -m gpu` runs it there); Triton's interpreter on a CPU
GPU_WHEN_PRESENT = pytest.mark.gpu if HAS_CUDA else (lambda test: test)


class Case:
    def __init__(self, name, B, T, H, lengths=None, scale=1.0, param_dtype=torch.float32, tags=("small",)):
        self.name, self.B, self.T, self.H, self.lengths = name, B, T, H, lengths
        self.scale, self.param_dtype, self.tags, self.dtypes = scale, param_dtype, frozenset(tags), ALL

    @property
    def cost(self):
        return self.B * self.T * self.H


CASES = [
    Case("decode-B1-Hv16", 1, 1, 16),
    Case("decode-B3-Hv32-one-padded", 3, 1, 32, lengths=(1, 0, 1)),
    Case("prefill-B2-T33-Hv16-ragged", 2, 33, 16, lengths=(33, 20)),
    Case("olmo-scale2-T9-Hv6", 2, 9, 6, scale=2.0),
    Case("odd-Hv1", 3, 5, 1),
    Case("odd-Hv3-model-dtype-params", 1, 7, 3, param_dtype=torch.bfloat16),
    Case("Hv48-T64", 1, 64, 48, lengths=(50,)),
    Case("no-tokens", 0, 4, 8),
    Case("prefill-T4096-Hv32", 1, 4096, 32, tags=("gpu",)),
]


def make_inputs(case, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    B, T, H = case.B, case.T, case.H
    proj = torch.randn(B, T, 3 * H, generator=gen) * 4
    proj[..., : H // 2 + 1] *= 6  # a + dt_bias across softplus's regimes (|x| up to ~70)
    proj = proj.to(dtype).to(device)
    lengths = case.lengths or (T,) * B
    mask = torch.arange(T)[None, :] < torch.tensor(lengths, dtype=torch.int64)[:, None]
    return {"a": proj[..., :H], "b": proj[..., 2 * H:],
            "A_log": (torch.randn(H, generator=gen) * 2).to(case.param_dtype).to(device),
            "dt_bias": (torch.randn(H, generator=gen)).to(case.param_dtype).to(device),
            "token_mask": mask.to(device), "scale": case.scale}


def oracle(x):
    a, b = x["a"].double().cpu(), x["b"].double().cpu()
    A, dt = x["A_log"].double().cpu(), x["dt_bias"].double().cpu()
    s = a + dt
    softplus = torch.where(s > 20, s, torch.log1p(torch.exp(s.clamp(max=20))))
    g = -torch.exp(A) * softplus
    beta = torch.sigmoid(b).to(x["b"].dtype).double() * x["scale"]
    real = x["token_mask"].cpu()[..., None]
    return torch.where(real, g, 0.0), torch.where(real, beta, 0.0)


def check(g, beta, x, dtype, interpreted):
    want_g, want_beta = oracle(x)
    assert g.dtype == torch.float32 and beta.dtype == dtype and g.shape == x["a"].shape == beta.shape
    g, beta = g.double().cpu(), beta.double().cpu()
    assert not (torch.isnan(g).any() or torch.isnan(beta).any()), "NaN (an element left unwritten?)"
    pad = ~x["token_mask"].cpu()
    assert (g[pad] == 0).all() and (beta[pad] == 0).all(), "a padded token must take g = 0, beta = 0"
    assert ((g - want_g).abs() <= want_g.abs() * 1e-5 + 1e-30).all(), "g off the oracle"
    ulps = 2 if (interpreted and dtype == torch.bfloat16) else 1
    rel = {torch.float32: 1e-6, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}[dtype] * ulps
    assert ((beta - want_beta).abs() <= want_beta.abs() * rel + torch.finfo(dtype).tiny).all(), "beta off the oracle"


def _torch(x):
    return op.gdn_gating_torch(x["a"], x["b"], x["A_log"], x["dt_bias"], x["token_mask"], x["scale"])


def _op(x):
    with use_backend("triton"):
        return op.gdn_gating(x["a"], x["b"], x["A_log"], x["dt_bias"], x["token_mask"], x["scale"])


def _triton(x):
    out = (poisoned(x["a"].shape, torch.float32, x["a"].device), poisoned(x["a"].shape, x["b"].dtype, x["a"].device))
    g, beta = op.gdn_gating_fused(x["a"], x["b"], x["A_log"], x["dt_bias"], x["token_mask"], x["scale"], out=out)
    assert g.data_ptr() == out[0].data_ptr() and beta.data_ptr() == out[1].data_ptr()
    return g, beta


IMPLS = [Impl("torch-form", "reference", _torch), Impl("op-triton-backend", "triton", _op),
         Impl("triton", "triton", _triton)]
RUN = runnable(CASES)


@pytest.mark.parametrize("impl,case,dtype", params(IMPLS, RUN, None, cost=lambda c: c.cost // 64))
def test_matches_float64_oracle(impl, case, dtype):
    impl.skip_if_unavailable()
    x = make_inputs(case, dtype, impl.device)
    g, beta = impl.run(x)
    check(g, beta, x, dtype, impl.interpreted)


def test_cpu_tensors_take_the_pytorch_form():
    x = make_inputs(CASES[0], torch.float32, "cpu")
    with use_backend("triton"):
        assert not op.fused_ready(x["a"], x["b"], x["A_log"], x["dt_bias"], x["token_mask"])


@GPU_WHEN_PRESENT
@pytest.mark.parametrize("family", ["qwen3_5", "olmo_hybrid"])
def test_layer_gates_through_the_fused_kernel(monkeypatch, family):
    """A GDN layer's gates (OLMo-Hybrid's beta scale 2 included) through the kernel where fused_eager's
    device check passes equal its PyTorch form, on a ragged batch."""
    from gdn_export.hf_config import parse_config
    from gdn_export.layout import DeployLayout
    from gdn_export.models import HybridForCausalLM
    from gdn_export.weights.tiny import init_tiny_weights, tiny_config_dict
    from tests.triton_interpreter import interpret_without_gpu

    interpret_without_gpu()
    device = "cuda" if HAS_CUDA else "cpu"
    model = HybridForCausalLM(parse_config(tiny_config_dict(family)), DeployLayout.make(cache_len=16)).eval()
    init_tiny_weights(model, 0)
    model.requires_grad_(False)  # as the loaders leave a model
    layer = next(m for m in model.modules() if hasattr(m, "gates")).to(device)
    H = layer.num_v_heads
    gen = torch.Generator().manual_seed(1)
    a, b = (torch.randn(2, 5, H, generator=gen) * 5).to(device), (torch.randn(2, 5, H, generator=gen) * 3).to(device)
    mask = (torch.arange(5)[None, :] < torch.tensor([5, 3])[:, None]).to(device)
    with use_backend("reference"):
        want = layer.gates(a, b, mask)
    with use_backend("triton"):
        calls = []
        fused = op.gdn_gating_fused
        if not HAS_CUDA:
            monkeypatch.setattr(backends, "on_gpu", lambda t: True)
        monkeypatch.setattr(op, "gdn_gating_fused", lambda *p, **k: calls.append(1) or fused(*p, **k))
        got = layer.gates(a, b, mask)
    assert calls == [1]
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-30)
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-30)
    assert family != "olmo_hybrid" or want[1].max() > 1.0  # the scale 2 reached beta


def test_fused_entry_refuses_what_breaks_the_contract():
    from tests.triton_interpreter import interpret_without_gpu

    interpret_without_gpu()
    x = make_inputs(CASES[2], torch.float32, "cpu")
    args = [x["a"], x["b"], x["A_log"], x["dt_bias"], x["token_mask"]]
    with pytest.raises(ValueError, match="a and b must be"):
        op.gdn_gating_fused(x["a"], x["b"][..., :-1], *args[2:])
    with pytest.raises(ValueError, match="A_log must be"):
        op.gdn_gating_fused(*args[:2], x["A_log"][:-1], *args[3:])
    with pytest.raises(ValueError, match="token_mask must be"):
        op.gdn_gating_fused(*args[:4], x["token_mask"].int())


def test_gradients_keep_the_pytorch_form(monkeypatch):
    """Trainable A_log / dt_bias with grad enabled pass the kernel (no backward) over."""
    monkeypatch.setattr(backends, "on_gpu", lambda t: True)
    x = make_inputs(CASES[2], torch.float32, "cpu")
    A_log = x["A_log"].clone().requires_grad_(True)
    with use_backend("triton"):
        assert not op.fused_ready(x["a"], x["b"], A_log, x["dt_bias"], x["token_mask"])
        g, _ = op.gdn_gating(x["a"], x["b"], A_log, x["dt_bias"], x["token_mask"])
    g.sum().backward()
    assert A_log.grad is not None and A_log.grad.abs().sum() > 0
