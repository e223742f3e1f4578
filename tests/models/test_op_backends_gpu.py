"""Whole tiny models with the fast op backends (triton, cuda) against the reference ops, on a GPU.

fp32: same model, same prompts, only the implementation of the gdn ops differs, so the logits and
states must agree within the fp32 kernel bound (relative RMS 2e-3).

bf16 / fp16: a half-precision tensor-core kernel must round its dot operands, and on these tiny
models rounding just the L2-normalised q and k to bf16 already moves the logits by 1.1-1.3%
relative RMS (benchmarks/investigations/precision_floor.py), over the 1e-2 op bound, while the bf16 model on exact
fp32 ops is itself 1.4-1.7% away from the fp32 model. So in half precision, logits within the op
bound of the reference ops pass; beyond it, both backends are measured against the fp32 model on the
reference ops (the truth), and the fast backend may not be more than 1.5x farther from it than the
reference ops in the same precision are, or 2.5% when that is more.
"""

import pytest
import torch

from gdn_export.layout import DeployLayout
from gdn_export.ops import use_backend
from gdn_export.weights import load_checkpoint
from gdn_export.weights.tiny import make_tiny_checkpoint
from tests.conftest import DTYPES, RMS_BOUND, assert_close_rms, rel_rms

pytestmark = pytest.mark.gpu

HALF_PRECISION_MARGIN = 1.5
# ... or this far from the fp32 model: where the reference ops in half precision land unusually near
# it (1.0% on one draw), the fast backend's own floor still applies (rounding q and k alone: 1.1-1.5%;
# an H100 run measured 1.68% against 1.01%). A wrong kernel is tens of percent away.
HALF_PRECISION_FLOOR = 2.5e-2


def _prefill_and_decode(model, ids, forced):
    """Logits of the prefill of `ids` [B, T] (ragged: the last row holds 1 token), then of one decode
    step per column of `forced`, every row at its own position."""
    B, T = ids.shape
    model.layout = DeployLayout.make(cache_len=T + forced.shape[1], logits="all")
    states = model.empty_states(B, device=ids.device)
    lens = torch.full((B,), T, device=ids.device)
    lens[-1] = 1
    logits, *states = model(ids, torch.zeros_like(lens), lens, *states)
    out = [logits[:, :1] if T == 1 else logits[:-1]]  # the padded row's tail is meaningless
    ones = torch.ones_like(lens)
    for s in range(forced.shape[1]):
        logits, *states = model(forced[:, s : s + 1], lens + s, ones, *states)
        out.append(logits)
    return out, states


@pytest.mark.parametrize("dtype", DTYPES)
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
        if dtype != torch.float32:
            truth_model = load_checkpoint(tmp_path / "ckpt", dtype=torch.float32, device=cuda_device)
            with use_backend("reference"):
                truth, _ = _prefill_and_decode(truth_model, ids, forced)
    if dtype == torch.float32:
        for step, (got, want) in enumerate(zip(logits, ref_logits)):
            assert_close_rms(got, want, dtype, name=f"{backend} logits step {step}")
        for i, (got, want) in enumerate(zip(states, ref_states)):
            if got.numel():
                assert_close_rms(got, want, dtype, name=f"{backend} state {i}")
        return
    for step, (got, ref, true) in enumerate(zip(logits, ref_logits, truth)):
        if rel_rms(got, ref) <= RMS_BOUND[dtype]:
            continue
        err, ref_err = rel_rms(got, true), rel_rms(ref, true)
        allowed = max(HALF_PRECISION_MARGIN * ref_err, HALF_PRECISION_FLOOR)
        assert err <= allowed, (
            f"{backend} logits step {step}: {err:.3g} from the fp32 model, reference ops in {dtype} "
            f"{ref_err:.3g} (allowed {HALF_PRECISION_MARGIN}x, at least {HALF_PRECISION_FLOOR:g})")
