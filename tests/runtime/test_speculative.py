"""Speculative decoding (gdn_export.runtime.speculative) on the torch runner.

Greedy: the same tokens as plain greedy decoding for K = 1..4, every MTP family, ragged prompts, fp32
and bf16. The roll-back at every acceptance length: a stub draft that knows plain greedy's next
tokens drafts exactly a correct tokens (a = 0 .. K, cycling over rows and rounds), so each length is
hit deterministically; the tokens, the accepted counts and the states left behind (GDN conv and
recurrent states, both K/V caches up to each row's length) are checked against a plain run over the
same tokens. Sampling: on an 8-token vocabulary, the joint law of three sampled tokens of 2000 rows
against the model's exact law (chi-square, fixed seed), with the test's power checked on a law it
must reject.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_export.errors import InputError
from gdn_export.layout import DeployLayout
from gdn_export.runtime.base import generate, prefill
from gdn_export.runtime.speculative import SpeculativeDecoder
from gdn_export.runtime.torch_runner import TorchRunner
from gdn_export.weights import load_checkpoint, make_tiny_checkpoint
from gdn_export.weights.mtp import load_mtp
from tests.mtp_checkpoints import MTP_FAMILIES, mtp_checkpoint
from tests.onnx._tiny import TWO_LAYERS
from tests.sampling_law import chi_square, exact_law

PROMPTS = [np.array([3, 1, 4, 1, 5, 9, 2]), np.array([6, 5]), np.array([3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4])]
N = 10


def _pair(path, dtype="fp32", cache_len=48):
    model = load_checkpoint(path, dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[dtype])
    model.layout = DeployLayout.make(cache_len=cache_len)
    return TorchRunner(model), load_mtp(path, model)


@pytest.fixture(scope="module")
def runners(tmp_path_factory):
    root = tmp_path_factory.getbasetemp()
    return {(f, d): _pair(mtp_checkpoint(f, root), d) for f in MTP_FAMILIES for d in ("fp32", "bf16")}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("family", MTP_FAMILIES)
def test_greedy_is_plain_greedy(runners, family, dtype):
    runner, mtp = runners[family, dtype]
    want = generate(runner, PROMPTS, N).generated
    for k in (1, 2, 3, 4) if dtype == "fp32" else (2,):
        result = SpeculativeDecoder(runner, mtp, k).generate(PROMPTS, N)
        np.testing.assert_array_equal(result.generated, want, err_msg=f"K={k}")
        assert result.verify_steps.min() >= 1 and 1.0 <= result.tokens_per_step <= k + 1


class PatternDraft:
    """Drafts exactly a correct tokens (then a wrong one) for each active row, a cycling through
    0..K over rounds and rows; `asked` counts the accepted drafts it asked for."""

    def __init__(self, reference: np.ndarray, k: int, vocab: int):
        self.reference, self.k, self.vocab = reference, k, vocab
        self.round, self.asked, self.lengths = 0, np.zeros(len(reference), np.int64), set()

    def __call__(self, s):
        emitted, limit = s.emitted.cpu().numpy(), s.limit.cpu().numpy()
        drafts = np.zeros((len(emitted), self.k), np.int64)
        for b, e in enumerate(emitted):
            right = self.reference[b, e:e + self.k]
            a = (self.round + b) % (self.k + 1)
            drafts[b] = right
            if a < self.k:
                drafts[b, a] = (right[a] + 1) % self.vocab
            if e < limit[b]:
                self.asked[b] += a
                self.lengths.add(a)
        self.round += 1
        return torch.from_numpy(drafts)


@pytest.mark.parametrize("family,k", [("qwen3_5", 1), ("qwen3_5", 2), ("qwen3_5", 3), ("qwen3_5", 4),
                                      ("qwen3_next", 3), ("qwen3_5_moe", 2)])
def test_every_acceptance_length_rolls_back(runners, family, k):
    runner, mtp = runners[family, "fp32"]
    reference = generate(runner, PROMPTS, N + 2 * k).generated
    stub = PatternDraft(reference, k, runner.vocab_size)
    decoder = SpeculativeDecoder(runner, mtp, k, draft=stub)
    session = decoder.start(PROMPTS, N)
    while decoder.running(session):
        decoder.step(session)
    assert stub.lengths == set(range(k + 1))  # none accepted .. all accepted
    np.testing.assert_array_equal(session.accepted.numpy(), stub.asked)
    emitted = session.emitted.numpy()
    assert (emitted >= N).all() and (emitted <= N + k).all()
    got = session.generated.numpy()
    for b in range(len(PROMPTS)):
        np.testing.assert_array_equal(got[b, :emitted[b]], reference[b, :emitted[b]])
    # the states now hold each row's prompt and its tokens but the pending last one
    seen = [np.concatenate([p, got[b, :emitted[b] - 1]]) for b, p in enumerate(PROMPTS)]
    np.testing.assert_array_equal(session.past.numpy(), [len(r) for r in seen])
    _, plain = prefill(runner, seen, runner.empty_states(len(seen)))
    for spec, mine, theirs in zip(runner.model.state_specs(), session.states, plain):
        if spec.kind in ("key", "value"):
            for b, r in enumerate(seen):
                torch.testing.assert_close(mine[b, :, :len(r)], theirs[b, :, :len(r)], rtol=1e-4, atol=1e-5,
                                           msg=f"{spec.name} row {b}")
        else:
            torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5, msg=spec.name)


# ---------------------------------------------------------------------------------------- sampling
V, ROWS, SEED = 8, 2000, 7


def _exact_law(runner, prompt: np.ndarray, temperature: float) -> np.ndarray:
    """P(x1, x2, x3) [V, V, V] of sampling three tokens after `prompt` at `temperature`."""
    return exact_law(runner.model, prompt, V, lambda logits: torch.softmax(logits.double() / temperature, -1))


def test_sampling_keeps_the_models_law(tmp_path):
    path = make_tiny_checkpoint(tmp_path / "v8", family="qwen3_5", seed=1, mtp_layers=1, vocab_size=V,
                                **TWO_LAYERS)
    runner, mtp = _pair(path, cache_len=16)
    prompt = np.array([1, 6, 2, 0, 5])
    decoder = SpeculativeDecoder(runner, mtp, 2, temperature=1.0, seed=SEED)
    result = decoder.generate([prompt] * ROWS, 3)
    assert 0.05 < result.acceptance_rate < 0.95  # both the acceptance and the rejection paths ran
    stat, bound = chi_square(result.generated, _exact_law(runner, prompt, 1.0))
    assert stat < bound, (stat, bound)
    # the same samples against a law only a little off (temperature 1.3) are rejected: the test
    # has the power to see a wrong rule
    stat, bound = chi_square(result.generated, _exact_law(runner, prompt, 1.3))
    assert stat > bound, (stat, bound)


def test_sampling_is_seeded(runners):
    runner, mtp = runners["qwen3_5", "fp32"]
    a, b, c = (SpeculativeDecoder(runner, mtp, 3, temperature=0.8, seed=s).generate(PROMPTS, N).generated
               for s in (5, 5, 6))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


# ------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("kwargs,message", [
    ({"k": 0}, "K must be an integer in [1, 16], got 0"),
    ({"k": 17}, "K must be an integer in [1, 16], got 17"),
    ({"k": 2, "temperature": -1.0}, "temperature must be a finite number >= 0, got -1.0"),
    ({"k": 2, "temperature": 0.5, "draft": lambda s: None}, "a stub draft gives no draft distribution"),
])
def test_bad_arguments(runners, kwargs, message):
    runner, mtp = runners["qwen3_5", "fp32"]
    with pytest.raises(InputError) as err:
        SpeculativeDecoder(runner, mtp, **kwargs)
    assert message in str(err.value)


@pytest.mark.parametrize("layout,message", [
    (DeployLayout.make(kv_cache="concat"), "needs the inplace kv cache layout"),
    (DeployLayout.make(sinks=4, window=40), "without a streaming window"),
])
def test_layouts_that_cannot_roll_back(tmp_path_factory, layout, message):
    path = mtp_checkpoint("qwen3_5", tmp_path_factory.getbasetemp())
    model = load_checkpoint(path)
    mtp = load_mtp(path, model)
    model.layout = layout
    with pytest.raises(InputError) as err:
        SpeculativeDecoder(TorchRunner(model), mtp, 2)
    assert message in str(err.value)


def test_cache_too_small_is_refused_before_the_prefill(runners):
    runner, mtp = runners["qwen3_5", "fp32"]
    with pytest.raises(InputError) as err:
        SpeculativeDecoder(runner, mtp, 4).generate(PROMPTS, 30)
    assert "needs 49 cache slots; the model has 48" in str(err.value)


@pytest.mark.slow
def test_quantized_checkpoint_keeps_its_head(tmp_path_factory, tmp_path):
    """gdn-export quantize carries the head over in 16 bits (excluded from quantization); speculative
    decoding on the fp8 model gives the fp8 model's own greedy tokens."""
    pytest.importorskip("modelopt")
    import json

    from gdn_export.quantize.pipeline import quantize_checkpoint

    source = mtp_checkpoint("qwen3_5", tmp_path_factory.getbasetemp())
    out = quantize_checkpoint(source, tmp_path / "fp8", "fp8", samples=2, seq_len=16)
    assert "mtp*" in json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    runner, mtp = _pair(out)
    assert type(runner.model.model.layers[0].mlp.gate_proj).__name__ != "Linear"  # quantized
    assert mtp.mtp.fc.weight.dtype == torch.float32
    _, want_mtp = _pair(source)
    torch.testing.assert_close(mtp.mtp.fc.weight, want_mtp.mtp.fc.weight, rtol=0, atol=0)
    want = generate(runner, PROMPTS, N).generated
    np.testing.assert_array_equal(SpeculativeDecoder(runner, mtp, 2).generate(PROMPTS, N).generated, want)
