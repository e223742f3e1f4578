"""A whole model through every eager glue kernel (docs/backends.md: RMSNorm, the residual add fused
into the norm after it, silu * up, GDN gating, rotary, the attention's output gate) against the same
model in their PyTorch forms: the four families, fp32 and bf16, a ragged prefill then decode steps on
the runner's in-place states. On a CPU the kernels run under Triton's interpreter with fused_eager's
device check forced (the gdn ops stay on the reference backend); on a GPU they run for real with the
triton backend.

fp32: logits within 1e-5 relative RMS and the same greedy tokens; bf16 (fed the PyTorch run's tokens,
so that a near-tie flipped once does not change later inputs): within 1e-2 on a GPU (each kernel
rounds where PyTorch does), 4e-2 under the interpreter, which truncates its bf16 casts (a tiny bf16
model's logits move ~2% with that alone). Every kernel must have run."""

from __future__ import annotations

import pytest
import torch

from gdn_export.hf_config import parse_config
from gdn_export.layout import DeployLayout
from gdn_export.models import HybridForCausalLM
from gdn_export.ops import backends, use_backend
from gdn_export.weights.tiny import init_tiny_weights, tiny_config_dict
from tests.ops.impl import HAS_CUDA

GPU_WHEN_PRESENT = pytest.mark.gpu if HAS_CUDA else (lambda test: test)
FAMILIES = ["qwen3_5", "qwen3_next", "qwen3_5_moe", "olmo_hybrid"]


def _run(model, ids, lens, steps, forced=None):
    """Logits of a ragged prefill and `steps` greedy decode steps: ([B, V] per call), tokens [B, steps].
    `forced` [B, steps]: feed these tokens instead of the greedy ones (the same inputs as another run,
    so that a bf16 near-tie flipped between two runs does not change what later calls see)."""
    B = ids.shape[0]
    device = ids.device
    states = model.empty_states(B)
    states = [s.to(device) for s in states]
    out = model(ids, torch.zeros(B, dtype=torch.long, device=device), lens, *states)
    logits, states = out[0], list(out[1:])
    got, tokens = [logits[:, -1].float()], []
    past = lens.clone()
    for _ in range(steps):
        token = got[-1].argmax(-1, keepdim=True) if forced is None else forced[:, len(tokens), None]
        tokens.append(token)
        out = model(token, past, torch.ones_like(lens), *states)
        logits, states = out[0], list(out[1:])
        got.append(logits[:, -1].float())
        past = past + 1
    return got, torch.cat(tokens, 1)


@GPU_WHEN_PRESENT
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_model_through_the_glue_kernels(monkeypatch, family, dtype):
    from tests.triton_interpreter import interpret_without_gpu

    interpret_without_gpu()
    device = "cuda" if HAS_CUDA else "cpu"
    torch.manual_seed(0)
    model = HybridForCausalLM(parse_config(tiny_config_dict(family)), DeployLayout.make(cache_len=24)).eval()
    init_tiny_weights(model, 1)
    model = model.to(dtype).to(device).requires_grad_(False)
    ids = torch.randint(0, model.config.vocab_size, (3, 9)).to(device)
    lens = torch.tensor([9, 5, 1]).to(device)
    backend = "triton" if HAS_CUDA else "reference"
    monkeypatch.setattr(backends, "FUSED", False)
    with use_backend(backend), torch.no_grad():
        want, want_tokens = _run(model, ids, lens, 3)
    monkeypatch.setattr(backends, "FUSED", True)
    if not HAS_CUDA:
        monkeypatch.setattr(backends, "on_gpu", lambda t: True)
    taken = []
    monkeypatch.setattr(backends, "fused_eager", _counted(backends.fused_eager, taken, forced=not HAS_CUDA))
    import gdn_export.ops.rms_norm as norm_op

    added = norm_op.add_rms_norm_fused
    monkeypatch.setattr(norm_op, "add_rms_norm_fused", lambda *a, **k: taken.append("add_rms_norm") or added(*a, **k))
    with use_backend(backend), torch.no_grad():
        got, tokens = _run(model, ids, lens, 3, forced=None if dtype == torch.float32 else want_tokens)
    # the MoE's shared expert is a SwiGLUMLP; every family has pre-norm blocks (OLMo's GDN blocks)
    expected = {"rms_norm", "gating", "rotary", "silu_mul", "add_rms_norm"}
    if getattr(model.model.layers[model.config.layer_kinds.index("full_attention")].self_attn, "gated", False):
        expected.add("output_gate")  # Qwen3-Next / Qwen3.5's gated attention (OLMo's has no gate)
    assert expected <= set(taken), f"kernels that ran: {sorted(set(taken))}"
    bound = 1e-5 if dtype == torch.float32 else (1e-2 if HAS_CUDA else 4e-2)
    for step, (g, w) in enumerate(zip(got, want)):
        err = ((g.double() - w.double()).norm() / w.double().norm()).item()
        assert err <= bound, f"call {step}: relative RMS {err:.3g} > {bound:g}"
    if dtype == torch.float32:
        assert torch.equal(tokens, want_tokens)


def _counted(fused_eager, taken: list, forced: bool):
    """fused_eager that records which op's kernel it let run (the calling module's last name part) and,
    when `forced`, reads the active backend as "triton" (the gdn ops themselves stay on the reference
    backend, whose CPU path the interpreter would otherwise replace)."""
    import sys

    def counted(x, *others, params=()):
        name = backends.current_name
        try:
            if forced:
                backends.current_name = lambda: "triton"
            ok = fused_eager(x, *others, params=params)
        finally:
            backends.current_name = name
        if ok:
            taken.append(sys._getframe(2).f_globals["__name__"].rsplit(".", 1)[-1])
        return ok

    return counted


@GPU_WHEN_PRESENT
@pytest.mark.parametrize("family", ["qwen3_5", "olmo_hybrid"])
def test_fp8_model_norms_write_the_projections_fp8_input(monkeypatch, family):
    """An FP8 model (ModelOpt calibration, fused siblings) prefilling 2 x 40 tokens (rows the FP8 GEMM
    takes): every decoder norm before an FP8 projection group, every GDN output norm and every gated
    attention's output gate writes the projection's FP8 input (gdn_export.modules.norm,
    gated_attention), and the logits are those of the same run with
    the projections quantizing their inputs themselves: bit for bit on a GPU, within the FP8 contract's
    1e-2 under the interpreter (whose unfused fp8_linear is the fp32 reference). OLMo-Hybrid's
    post-norm attention blocks keep the plain path."""
    import numpy as np

    import gdn_export.modules.gated_attention as attention_module
    import gdn_export.modules.norm as norm_module
    import gdn_export.modules.quant_linear as quant_module
    from gdn_export.modules.fused_linear import fuse_linears
    from gdn_export.quantize import calibrate
    from tests.triton_interpreter import interpret_without_gpu

    pytest.importorskip("modelopt")
    interpret_without_gpu()
    device = "cuda" if HAS_CUDA else "cpu"
    torch.manual_seed(0)
    config = parse_config(tiny_config_dict(family))
    model = HybridForCausalLM(config, DeployLayout.make(cache_len=48)).eval()
    init_tiny_weights(model, 2)
    rng = np.random.default_rng(0)
    tensors = calibrate.calibrate(model, "fp8", [rng.integers(0, config.vocab_size, 16) for _ in range(2)])
    model = calibrate.apply(model, "fp8", tensors).to(torch.bfloat16).to(device).requires_grad_(False)
    assert fuse_linears(model) > 0
    ids = torch.randint(0, config.vocab_size, (2, 40)).to(device)
    lens = torch.tensor([40, 33]).to(device)
    past = torch.zeros(2, dtype=torch.long, device=device)
    backend = "triton" if HAS_CUDA else "reference"
    if not HAS_CUDA:
        monkeypatch.setattr(backends, "on_gpu", lambda t: True)
        monkeypatch.setattr(backends, "fused_eager", _counted(backends.fused_eager, [], forced=True))
    states = [s.to(device) for s in model.empty_states(2)]
    ready = norm_module.prequantized_ready if HAS_CUDA else (lambda *a: True)  # the GPU's gate, else opened
    producers = (norm_module, attention_module)
    for module in producers:
        monkeypatch.setattr(module, "prequantized_ready", lambda *a: False)
    with use_backend(backend), torch.no_grad():
        want = model(ids, past, lens, *states)[0]
    for module in producers:
        monkeypatch.setattr(module, "prequantized_ready", ready)
    calls = []
    for module in (*producers, quant_module):
        real = module.fp8_linear_quantized
        monkeypatch.setattr(module, "fp8_linear_quantized",
                            lambda *a, real=real, **k: calls.append(a[3].shape[0]) or real(*a, **k))
    with use_backend(backend), torch.no_grad():
        got = model(ids, past, lens, *states)[0]
    kinds = config.layer_kinds
    gdn = sum(k == "linear_attention" for k in kinds)
    pre_norm = len(kinds) if family != "olmo_hybrid" else gdn
    gated = sum(getattr(layer.self_attn, "gated", False) for layer in model.model.layers if hasattr(layer, "self_attn"))
    assert gated == (len(kinds) - gdn if family == "qwen3_5" else 0)
    # input and post-attention norms, GDN output norms, the gated attentions' output gates
    assert len(calls) == 2 * pre_norm + gdn + gated, calls
    if HAS_CUDA:
        assert torch.equal(got, want)
    else:
        err = ((got.double() - want.double()).norm() / want.double().norm()).item()
        assert err <= 1e-2, err
