"""Whole tiny models with the fast op backends (triton, cuda) against the reference ops, on a GPU.

Same model, same precision, same prompts: only the implementation of the gdn ops differs, so the
logits must agree within the per-dtype kernel bounds (relative RMS, fp32 2e-3, bf16/fp16 1e-2).
"""

import pytest
import torch

from gdn_export.ops import use_backend
from gdn_export.weights import load_checkpoint
from gdn_export.weights.tiny import make_tiny_checkpoint
from tests.conftest import assert_close_rms

pytestmark = pytest.mark.gpu


def _prefill_and_decode(model, ids, forced):
    """Logits of the prefill of `ids` [B, T], then of one decode step per column of `forced`."""
    B, T = ids.shape
    states = model.empty_states(B, device=ids.device)
    pos = torch.arange(T, device=ids.device).expand(B, T)
    logits, *states = model(ids, pos, *states)
    out = [logits]
    for s in range(forced.shape[1]):
        pos = torch.full((B, 1), T + s, device=ids.device)
        logits, *states = model(forced[:, s : s + 1], pos, *states)
        out.append(logits)
    return out, states


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("prompt_len", [1, 63, 130], ids=lambda t: f"T{t}")
def test_tiny_model_fast_backend_matches_reference(tmp_path, cuda_device, backend, family, dtype, prompt_len):
    make_tiny_checkpoint(tmp_path / "ckpt", family=family, seed=prompt_len)
    model = load_checkpoint(tmp_path / "ckpt", dtype=dtype, device=cuda_device)
    ids = torch.randint(0, model.config.vocab_size, (2, prompt_len), device=cuda_device)
    forced = torch.randint(0, model.config.vocab_size, (2, 8), device=cuda_device)
    with torch.no_grad():
        with use_backend("reference"):
            ref_logits, ref_states = _prefill_and_decode(model, ids, forced)
        with use_backend(backend):
            logits, states = _prefill_and_decode(model, ids, forced)
    for step, (got, want) in enumerate(zip(logits, ref_logits)):
        assert_close_rms(got, want, dtype, name=f"{backend} logits step {step}")
    for i, (got, want) in enumerate(zip(states, ref_states)):
        if got.numel():
            assert_close_rms(got.float(), want.float(), dtype, name=f"{backend} state {i}")
