"""A whole model with an FP8 K/V cache against its oracle: the same model with a model-dtype cache
whose attention layers quantize-dequantize K and V (e4m3 of K / k_scale, times k_scale; the same for
V) before they are cached, i.e. attention over a dequantized cache. Prefill of ragged rows, then
decode steps, every family, the in-place and the streaming layout; the cache states themselves
equal the oracle's cache divided by the scales, code for code. Tolerance: 1e-6 relative RMS of the
logits in fp32 and bf16 (the same arithmetic on the CPU: measured 0, bitwise, for every case here)."""

from __future__ import annotations

import pytest
import torch

from gdn_export.errors import GdnExportError
from gdn_export.layout import DeployLayout
from gdn_export.modules.kv_cache_fp8 import attention_layers, kv_scales, set_kv_scales
from gdn_export.ops.attention.kv_fp8 import FP8, FP8_MAX, dequantize_ref, quantize_ref
from gdn_export.runtime.memory import generation_bytes
from gdn_export.weights import load_checkpoint, make_tiny_checkpoint

FAMILIES = ("qwen3_5", "qwen3_next", "qwen3_5_moe", "olmo_hybrid")
LAYOUTS = {"inplace": DeployLayout.make(cache_len=160),
           "streaming": DeployLayout.make(cache_len=48, sinks=4, window=44)}
TOL = {torch.float32: 1e-6, torch.bfloat16: 1e-6}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("kvfp8")
    return {f: make_tiny_checkpoint(root / f, f, seed=3) for f in FAMILIES}


def _scales(model) -> dict[int, tuple[float, float]]:
    # amax-like scales of different sizes per layer and for K / V
    return {i: (0.011 * (1 + 0.1 * i), 0.004 * (1 + 0.05 * i)) for i in attention_layers(model)}


def _fake_quant_oracle(model, scales):
    """model's attention layers round K / V through e4m3 with `scales` before the model-dtype cache."""
    for i, m in attention_layers(model).items():
        ks, vs = scales[i]
        project = m.project

        def fq(x, cos, sin, project=project, ks=ks, vs=vs):
            q, k, v, gate = project(x, cos, sin)
            return (q, dequantize_ref(quantize_ref(k, ks), ks, k.dtype),
                    dequantize_ref(quantize_ref(v, vs), vs, v.dtype), gate)
        m.project = fq
    return model


def _run(model, prompts, lengths, steps):
    """Ragged prefill, then `steps` decode steps feeding token 7 + i; returns (logits list, states)."""
    B = prompts.shape[0]
    out = model(prompts, torch.zeros(B, dtype=torch.long), lengths, *model.empty_states(B))
    logits, states, past = [out[0]], list(out[1:]), lengths.clone()
    for i in range(steps):
        out = model(torch.full((B, 1), 7 + i), past, torch.ones(B, dtype=torch.long), *states)
        logits.append(out[0])
        states, past = list(out[1:]), past + 1
    return logits, states


def rel(a, b):
    return float((a.double() - b.double()).pow(2).mean().sqrt() / b.double().pow(2).mean().sqrt())


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", list(TOL), ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_fp8_cache_model_matches_dequantized_cache_oracle(checkpoints, family, dtype, layout):
    model = load_checkpoint(checkpoints[family], dtype=dtype)
    model.layout = LAYOUTS[layout]
    scales = _scales(model)
    set_kv_scales(model, scales)
    oracle = _fake_quant_oracle(load_checkpoint(checkpoints[family], dtype=dtype), scales)
    oracle.layout = LAYOUTS[layout]
    gen = torch.Generator().manual_seed(0)
    T = 40 if layout == "streaming" else 65
    prompts = torch.randint(0, model.config.vocab_size, (3, T), generator=gen)
    lengths = torch.tensor([T, 1, T - 2])
    got, states = _run(model, prompts, lengths, steps=6)
    want, ref_states = _run(oracle, prompts, lengths, steps=6)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        assert rel(a, b) <= TOL[dtype]
    specs = model.state_specs()
    for spec, s, r in zip(specs, states, ref_states):
        if spec.kind in ("key", "value"):
            assert s.dtype == FP8 and spec.dtype == FP8
            ks, vs = scales[spec.layer]
            # the oracle's cache holds dequantized values: divided by the scale, the same e4m3 codes
            codes = quantize_ref(r.float(), ks if spec.kind == "key" else vs)
            assert torch.equal(s.view(torch.uint8), codes.view(torch.uint8))
        else:
            assert s.dtype == r.dtype  # conv / recurrent states keep their dtypes


def test_state_specs_memory_and_default(checkpoints):
    model = load_checkpoint(checkpoints["qwen3_5"], dtype=torch.bfloat16)
    plan = type("P", (), {"state_specs": model.state_specs(), "layout": model.layout, "vocab_size": 256})
    before, _ = generation_bytes(plan, [torch.zeros(5)], 3)
    assert kv_scales(model) is None and all(s.dtype != FP8 for s in model.state_specs())
    set_kv_scales(model, _scales(model))
    plan.state_specs = model.state_specs()
    after, _ = generation_bytes(plan, [torch.zeros(5)], 3)
    kv = sum(torch.Size(s.concrete_shape(1)).numel() for s in model.state_specs() if s.kind in ("key", "value"))
    assert before - after == kv  # one byte a cache element instead of two
    rec = [s for s in model.state_specs() if s.kind == "recurrent"]
    assert rec and all(s.dtype == model.layout.state_dtype for s in rec)
    set_kv_scales(model, None)
    assert all(s.dtype == torch.bfloat16 for s in model.state_specs() if s.kind in ("key", "value"))


def test_bad_scales_and_layouts(checkpoints):
    model = load_checkpoint(checkpoints["qwen3_5"])
    (layer,) = attention_layers(model)
    with pytest.raises(GdnExportError, match="finite and > 0"):
        set_kv_scales(model, {layer: (0.0, 1.0)})
    with pytest.raises(GdnExportError, match="finite and > 0"):
        set_kv_scales(model, {layer: (1.0, float("nan"))})
    with pytest.raises(GdnExportError, match="attention layers are"):
        set_kv_scales(model, {layer + 1: (1.0, 1.0)})
    set_kv_scales(model, {layer: (1.0, 1.0)})
    model.layout = DeployLayout.make(kv_cache="concat", logits="all")
    with pytest.raises(GdnExportError, match="in-place cache layout"):
        model.state_specs()


def test_scale_saturates_outliers(checkpoints):
    """A scale too small for the data saturates to +-448 (never inf / NaN in the cache)."""
    model = load_checkpoint(checkpoints["qwen3_5"])
    set_kv_scales(model, {i: (1e-6, 1e-6) for i in attention_layers(model)})
    out = model(torch.randint(0, 256, (1, 9)), torch.zeros(1, dtype=torch.long), torch.tensor([9]),
                *model.empty_states(1))
    key = [s for s, spec in zip(out[1:], model.state_specs()) if spec.kind == "key"][0]
    assert key.float()[:, :, :9].abs().max() == FP8_MAX and torch.isfinite(key.float()).all()
    assert torch.isfinite(out[0]).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none found)")
@pytest.mark.parametrize("cache_len", [160, 320], ids=["prefill-kernel-decode", "split-kv-decode"])
@torch.no_grad()
def test_fp8_cache_model_on_gpu_matches_oracle(checkpoints, cache_len):
    """bf16 on the GPU: the Triton write (scale, clamp, cast) and the fp8 decode / prefill kernels
    against the oracle's 16-bit cache of the same dequantized values through the 16-bit kernels:
    the same tile values, so equal up to 1e-6 (expected bitwise)."""
    layout = DeployLayout.make(cache_len=cache_len)
    model = load_checkpoint(checkpoints["qwen3_5"], dtype=torch.bfloat16, device="cuda")
    model.layout = layout
    scales = _scales(model)
    set_kv_scales(model, scales)
    oracle = _fake_quant_oracle(load_checkpoint(checkpoints["qwen3_5"], dtype=torch.bfloat16, device="cuda"), scales)
    oracle.layout = layout
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, model.config.vocab_size, (3, 65), generator=gen).cuda()
    lengths = torch.tensor([65, 1, 63]).cuda()

    def run(m):
        B = prompts.shape[0]
        out = m(prompts, torch.zeros(B, dtype=torch.long, device="cuda"), lengths, *m.empty_states(B))
        logits, states, past = [out[0]], list(out[1:]), lengths.clone()
        for i in range(6):
            out = m(torch.full((B, 1), 7 + i, device="cuda"), past, torch.ones(B, dtype=torch.long, device="cuda"),
                    *states)
            logits.append(out[0])
            states, past = list(out[1:]), past + 1
        return logits, states

    got, states = run(model)
    want, _ = run(oracle)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all() and rel(a, b) <= 1e-6
    assert all(s.dtype == FP8 for s, spec in zip(states, model.state_specs()) if spec.kind in ("key", "value"))
