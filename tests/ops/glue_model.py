"""One eager glue kernel inside a whole model: the helper of the glue ops' whole-model tests
(tests/ops/rotary, tests/ops/output_gate)."""

from __future__ import annotations

import torch

from gdn_export.ops import backends, use_backend
from tests.ops.impl import HAS_CUDA


def logits_through_one_kernel(monkeypatch, op, fused_name: str, family: str):
    """(want, got, calls, model): a tiny bf16 `family` model's logits of a ragged prefill (rows of 6 and 4
    tokens, fixed ids) with every op on the reference backend, then again with the fused kernel of op
    module `op` (its entry `fused_name`) taken: only that op's readiness check sees the triton backend,
    every other op stays on the reference; on a CPU the device check is forced and the kernel runs under
    Triton's interpreter. calls: one entry per fused call."""
    from gdn_export.hf_config import parse_config
    from gdn_export.layout import DeployLayout
    from gdn_export.models import HybridForCausalLM
    from gdn_export.weights.tiny import init_tiny_weights, tiny_config_dict
    from tests.triton_interpreter import interpret_without_gpu

    interpret_without_gpu()
    device = "cuda" if HAS_CUDA else "cpu"
    model = HybridForCausalLM(parse_config(tiny_config_dict(family)), DeployLayout.make(cache_len=16)).eval()
    init_tiny_weights(model, 0)
    model = model.to(torch.bfloat16).to(device).requires_grad_(False)
    ids = torch.randint(0, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0)).to(device)
    lens = torch.tensor([6, 4]).to(device)
    past = torch.zeros(2, dtype=torch.long, device=device)
    with use_backend("reference"), torch.no_grad():
        want = model(ids, past, lens, *model.empty_states(2))[0]
    calls = []
    fused, ready = getattr(op, fused_name), op.fused_ready
    if not HAS_CUDA:
        monkeypatch.setattr(backends, "on_gpu", lambda t: True)

    def ready_as_triton(*a, **k):
        with use_backend("triton"):
            return ready(*a, **k)

    monkeypatch.setattr(op, "fused_ready", ready_as_triton)
    monkeypatch.setattr(op, fused_name, lambda *a, **k: calls.append(1) or fused(*a, **k))
    with use_backend("reference"), torch.no_grad():
        got = model(ids, past, lens, *model.empty_states(2))[0]
    return want, got, calls, model


def relative_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()
