"""Speculative decoding in the engine (gdn_export.serve.speculation): every greedy request gets the
tokens of its prompt run alone through the eager runner, whatever shares the batch (arrivals while
others decode, chunked prompts, a full pool, stop ids, cancellation) and however many drafts a round
keeps (a stub that knows the right tokens keeps 0 .. K of them, cycling); the head's prefill in
chunks equals the runtime's one-shot prefill; sampling requests keep the law of plain sampling (the
rejection rule under each request's own temperature, top_k and top_p) and repeat with their seed;
the cache room a round needs is kept free."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_export.runtime.speculative import SpeculativeDecoder
from gdn_export.serve.errors import BadRequest
from gdn_export.serve.sampling import SamplingParams, probabilities
from gdn_export.serve.scheduler import Limits
from gdn_export.serve.speculation import Speculation
from gdn_export.weights.mtp import load_mtp
from tests.mtp_checkpoints import mtp_checkpoint
from tests.sampling_law import chi_square, exact_law
from tests.serve.conftest import CACHE_LEN, Reference, fast_runner, start_engine, until_stop

LENGTHS = (1, 5, 13, 40, 90, 7, 26, 3)
MAX_TOKENS = (6, 11, 1, 9, 12, 8, 5, 10)
LIMITS = Limits(max_num_seqs=4, max_prefill_seqs=2, prefill_tokens=24, max_queue=16)


class RightDrafts:
    """Drafts exactly `a` of the reference's next tokens, then a wrong one, `a` cycling through
    0..K over rounds and rows; `lengths` collects the a asked for."""

    def __init__(self, ref: Reference, k: int, vocab: int):
        self.ref, self.k, self.vocab = ref, k, vocab
        self.round, self.lengths = 0, set()

    def __call__(self, spec: Speculation, session) -> torch.Tensor:
        drafts = np.zeros((len(spec.rows), self.k), np.int64)
        for b, seq in enumerate(spec.rows):
            want = self.ref(seq.prompt, seq.params.max_tokens + self.k + 1)
            done = len(seq.generated)
            right = (want[done:done + self.k] + [0] * self.k)[:self.k]
            a = (self.round + b) % (self.k + 1)
            drafts[b] = right
            if a < self.k:
                drafts[b, a] = (right[a] + 1) % self.vocab
            self.lengths.add(a)
        self.round += 1
        return torch.from_numpy(drafts)


@pytest.mark.parametrize("family,k", [("qwen3_5", 1), ("qwen3_5", 3), ("qwen3_next", 2), ("qwen3_5_moe", 4)])
def test_greedy_requests_get_the_tokens_of_their_prompt_alone(tmp_path_factory, family, k):
    ckpt = mtp_checkpoint(family, tmp_path_factory.getbasetemp())
    runner = fast_runner(ckpt)
    ref = Reference(ckpt)
    prompts = [np.random.default_rng(3).integers(0, runner.vocab_size, n) for n in LENGTHS]
    stop_at = ref(prompts[6], MAX_TOKENS[6])[2]
    params = [SamplingParams(max_tokens=m, stop_token_ids=frozenset({stop_at}) if i == 6 else frozenset())
              for i, m in enumerate(MAX_TOKENS)]
    drafts = RightDrafts(ref, k, runner.vocab_size)
    spec = Speculation(runner, load_mtp(ckpt, runner.model), k, draft=drafts)
    engine, got = start_engine(runner, LIMITS, speculation=spec)
    try:
        seqs = {i: engine.submit(prompts[i], params[i], i) for i in range(8)}
        engine.cancel(seqs[7])  # while it waits or runs: either way it ends "cancelled"
        got.wait(range(8))
        assert engine.idle and engine.stats()["reserved_tokens"] == 0
    finally:
        engine.stop()
    assert drafts.lengths == set(range(k + 1))  # none accepted .. all accepted
    for i, prompt in enumerate(prompts):
        want, tokens, last = ref(prompt, MAX_TOKENS[i]), got.tokens(i), got.finished[i]
        if i == 7:
            assert last.finish_reason == "cancelled" and tokens == want[:len(tokens)]
        elif i == 6:
            assert tokens == until_stop(want, {stop_at}) and last.finish_reason == "stop"
        else:
            assert tokens == want and last.finish_reason == "length", (i, tokens, want)
            assert last.generated == MAX_TOKENS[i]


def test_the_mtp_head_drafts_in_the_engine(tmp_path_factory):
    """The head itself (random weights: it agrees with nothing) drafting after chunked prefills."""
    ckpt = mtp_checkpoint("qwen3_5_moe", tmp_path_factory.getbasetemp())
    runner = fast_runner(ckpt)
    ref = Reference(ckpt)
    prompts = [np.random.default_rng(5).integers(0, runner.vocab_size, n) for n in LENGTHS]
    engine, got = start_engine(runner, LIMITS, speculation=Speculation(runner, load_mtp(ckpt, runner.model), 2))
    try:
        for i, p in enumerate(prompts):
            engine.submit(p, SamplingParams(max_tokens=MAX_TOKENS[i]), i)
        got.wait(range(8))
    finally:
        engine.stop()
    for i, p in enumerate(prompts):
        assert got.tokens(i) == ref(p, MAX_TOKENS[i]), i


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_head_prefill_in_chunks_equals_one_call(tmp_path_factory, chunk):
    """Speculation.prefill over ragged rows in chunks (first and later chunks in one call) leaves the
    head's cache, its catch-up hidden state and position as SpeculativeDecoder's one-shot prefill."""
    ckpt = mtp_checkpoint("qwen3_5", tmp_path_factory.getbasetemp())
    runner = fast_runner(ckpt)
    mtp = load_mtp(ckpt, runner.model)
    prompts = [np.random.default_rng(9).integers(0, runner.vocab_size, n) for n in (1, 17, 9)]
    want = SpeculativeDecoder(runner, mtp, 2, cuda_graph=False).start(prompts, 4)
    spec = Speculation(runner, mtp, 2)
    states, extra = list(runner.model.empty_states(3)), spec.extra_states(3)
    lens = np.array([len(p) for p in prompts])
    done = np.zeros(3, np.int64)
    starts = {0: 0, 1: 3, 2: 0}  # row 1 starts a chunk later: its first chunk meets the others' second
    step = 0
    while (done < lens).any():
        live = [b for b in range(3) if done[b] < lens[b] and step >= starts[b]]
        step += 1
        if not live:
            continue
        n = np.zeros(3, np.int64)
        for b in live:
            n[b] = min(chunk, lens[b] - done[b])
        rows = [b for b in range(3) if n[b]]
        width = int(n.max())
        ids = np.zeros((len(rows), width), np.int64)
        for i, b in enumerate(rows):
            ids[i, :n[b]] = prompts[b][done[b]:done[b] + n[b]]
        index = torch.tensor(rows)
        view_states = [t.index_select(0, index) for t in states]
        view_extra = [t.index_select(0, index) for t in extra]
        spec.prefill(torch.from_numpy(ids), torch.from_numpy(done[rows]), torch.from_numpy(n[rows]),
                     view_states, view_extra)
        for full, part in zip(states + extra, view_states + view_extra):
            full.index_copy_(0, index, part)
        done += n
    kv, _, hidden, _, head_past = spec._split(extra, 3)
    np.testing.assert_array_equal(head_past.numpy(), lens - 1)
    torch.testing.assert_close(hidden[:, 0], want.catch_hidden[:, 0], rtol=1e-5, atol=1e-6)
    for mine, theirs in zip(kv, want.mtp_states):
        for b, n in enumerate(lens - 1):  # the head has seen positions 0 .. n-2
            torch.testing.assert_close(mine[b, :, :n], theirs[b, :, :n], rtol=1e-5, atol=1e-6)


class GreedyDrafts:
    """Drafts the model's greedy continuation of each row's tokens so far: all accepted for a greedy
    request, and what the greedy rule would accept for a sampling one too."""

    def __init__(self, ref: Reference, k: int):
        self.ref, self.k = ref, k

    def __call__(self, spec: Speculation, session) -> torch.Tensor:
        rows = [self.ref(np.concatenate([s.prompt, s.generated]), self.k) for s in spec.rows]
        return torch.tensor(rows, dtype=torch.int64)


V, ROWS = 8, 2000
LAW_PARAMS = SamplingParams(max_tokens=3, temperature=1.0, top_k=6, top_p=0.95)


def _exact_law(runner, prompt: np.ndarray, params: SamplingParams) -> np.ndarray:
    """P(x1, x2, x3) [V, V, V] of sampling three tokens after `prompt` with `params` (the filter of
    plain sampling, gdn_export.serve.sampling.probabilities, on every position's logits)."""
    return exact_law(runner.model, prompt, V, lambda logits: probabilities(logits, [params] * len(logits)))


def test_sampling_requests_keep_the_models_law(tmp_path):
    """2000 sampling rows (temperature 1, top_k 6, top_p 0.95) of one prompt through the engine's
    prefill and rounds with the head's own drafts: the first three tokens follow plain sampling's
    law (chi-square at p = 1e-3), and the same samples reject a law a little off (temperature 1.3)."""
    from gdn_export.serve.sampling import pick_tokens
    from gdn_export.serve.scheduler import Sequence
    from gdn_export.weights import make_tiny_checkpoint
    from tests.onnx._tiny import TWO_LAYERS

    ckpt = make_tiny_checkpoint(tmp_path / "v8", family="qwen3_5", seed=1, mtp_layers=1, vocab_size=V, **TWO_LAYERS)
    runner = fast_runner(ckpt, cache_len=16)
    spec = Speculation(runner, load_mtp(ckpt, runner.model), 2)
    prompt = np.array([1, 6, 2, 0, 5])
    shared = torch.Generator().manual_seed(7)
    states, extra = list(runner.model.empty_states(ROWS)), spec.extra_states(ROWS)
    spec.bind(states, extra, [ROWS])  # the rounds run on these rows, which the prefill fills first
    with torch.no_grad():
        ids = torch.from_numpy(np.tile(prompt, (ROWS, 1)))
        logits = spec.prefill(ids, torch.zeros(ROWS, dtype=torch.long), torch.full((ROWS,), len(prompt)),
                              states, extra)
        first = pick_tokens(logits, [LAW_PARAMS] * ROWS, [None] * ROWS, shared).tolist()
        spec.first_tokens(extra, range(ROWS), first)
        seqs = []
        for i, t in enumerate(first):
            seq = Sequence(i, prompt, LAW_PARAMS, None, prefilled=len(prompt))
            seq.generated.append(t)
            seqs.append(seq)
        kept = []
        while min(len(s.generated) for s in seqs) < 3:
            for s, new in zip(seqs, spec.round(seqs, shared)):
                s.launched += len(new)
                s.generated += new.tolist()
                kept.append(len(new))
    assert 1 < np.mean(kept) < 3  # both the acceptance and the rejection paths ran
    samples = np.array([s.generated[:3] for s in seqs])
    stat, bound = chi_square(samples, _exact_law(runner, prompt, LAW_PARAMS))
    assert stat < bound, (stat, bound)
    hotter = SamplingParams(max_tokens=3, temperature=1.3, top_k=6, top_p=0.95)
    stat, bound = chi_square(samples, _exact_law(runner, prompt, hotter))
    assert stat > bound, (stat, bound)


def test_seeded_sampling_requests_repeat(tmp_path_factory):
    """A seeded sampling request gets the same tokens again (its drafts, acceptances and draws all come
    from its own generator), another seed other tokens; a greedy request beside them stays exact."""
    ckpt = mtp_checkpoint("qwen3_5", tmp_path_factory.getbasetemp())
    ref = Reference(ckpt)
    prompts = [np.random.default_rng(11).integers(0, 200, n) for n in (4, 9, 2)]
    outputs = []
    for seed in (5, 5, 6):
        params = [SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, top_k=40, seed=seed + i) for i in range(3)]
        params[1] = SamplingParams(max_tokens=10)
        runner = fast_runner(ckpt)
        engine, got = start_engine(runner, LIMITS, speculation=Speculation(runner, load_mtp(ckpt, runner.model), 3))
        try:
            for i, p in enumerate(prompts):
                engine.submit(p, params[i], i)
            got.wait(range(3))
        finally:
            engine.stop()
        outputs.append([got.tokens(i) for i in range(3)])
    assert outputs[0] == outputs[1] and outputs[0] != outputs[2]
    assert outputs[0][1] == outputs[2][1] == ref(prompts[1], 10)
    assert all(len(t) == 10 for out in outputs for t in out)


def test_a_round_always_has_room_in_the_cache(tmp_path_factory):
    """prompt + max_tokens may fill the cache but the 2K slots a round writes past a row's end."""
    ckpt = mtp_checkpoint("qwen3_5", tmp_path_factory.getbasetemp())
    runner = fast_runner(ckpt, cache_len=40)
    k = 3
    spec = Speculation(runner, load_mtp(ckpt, runner.model), k)
    engine, got = start_engine(runner, LIMITS, speculation=spec)
    try:
        with pytest.raises(BadRequest, match="maximum context length is 34 tokens"):
            engine.submit(np.arange(30), SamplingParams(max_tokens=5), "too long")
        engine.submit(np.arange(30), SamplingParams(max_tokens=4), "fits")
        got.wait(["fits"])
        # a request without max_tokens gets the room it has: the 34 tokens, not the 40 slots
        assert engine.cache_len == 34
    finally:
        engine.stop()
    assert got.tokens("fits") == Reference(ckpt, cache_len=40)(np.arange(30), 4)


def test_streamed_over_http(tmp_path_factory):
    """Through the OpenAI routes: a streamed completion of a speculative server (rounds of several
    tokens) carries the tokens and usage of a plain server's."""
    from tests.serve.conftest import LiveServer
    from tests.serve.http_client import call, events

    ckpt = mtp_checkpoint("qwen3_5", tmp_path_factory.getbasetemp())
    ref = Reference(ckpt)
    body = {"model": "tiny", "prompt": [3, 1, 4, 1, 5], "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    runner = fast_runner(ckpt)
    server = LiveServer(ckpt, runner=runner, speculation=Speculation(runner, load_mtp(ckpt, runner.model), 3,
                                                                     draft=GreedyDrafts(ref, 3)))
    try:
        chunks = events(server.url, "/v1/completions", body)
        plain_body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        _, _, plain = call(server.url, "/v1/completions", plain_body)
        metrics = server.metrics.render().decode()
        _, _, models = call(server.url, "/v1/models", method="GET")
        status, _, unbounded = call(server.url, "/v1/completions", {"model": "tiny", "prompt": [3, 1, 4],
                                                                    "temperature": 0, "ignore_eos": True})
        assert status == 200, unbounded
    finally:
        server.stop()
    assert chunks[-1] == "[DONE]" and chunks[-2]["usage"]["completion_tokens"] == 12
    # every round of the greedy drafts keeps all 3: 2 requests x 12 tokens, 1 from each prefill
    assert "gdn_serve_spec_accepted_tokens_total 18.0" in metrics, metrics
    streamed = [t for c in chunks[:-2] for t in c["choices"][0]["token_ids"]]  # no tokenizer: token ids
    assert streamed == plain["choices"][0]["token_ids"] == ref([3, 1, 4, 1, 5], 12)
    assert plain["usage"]["completion_tokens"] == 12
    # without max_tokens a request gets the room the cache has beside the rounds' 2K slots
    assert models["data"][0]["max_model_len"] == CACHE_LEN - 6
    assert unbounded["usage"]["prompt_tokens"] + unbounded["usage"]["completion_tokens"] <= CACHE_LEN - 6


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["fp8", "int4-awq"])
def test_quantized_checkpoints(tmp_path_factory, tmp_path, fmt):
    """`gdn-export quantize` keeps the head in 16 bits; the quantized model's greedy tokens come out
    of speculative rounds that keep every draft and rounds that keep none."""
    pytest.importorskip("modelopt")
    from gdn_export.quantize.pipeline import quantize_checkpoint

    ckpt = quantize_checkpoint(mtp_checkpoint("qwen3_5_moe", tmp_path_factory.getbasetemp()), tmp_path / fmt, fmt,
                               samples=2, seq_len=16)
    ref = Reference(ckpt)
    prompts = [np.random.default_rng(1).integers(0, 200, n) for n in (3, 30, 8)]
    for draft in (GreedyDrafts(ref, 2), None):
        runner = fast_runner(ckpt)
        spec = Speculation(runner, load_mtp(ckpt, runner.model), 2, draft=draft)
        engine, got = start_engine(runner, Limits(max_num_seqs=2, max_prefill_seqs=2, prefill_tokens=16),
                                   speculation=spec)
        try:
            for i, p in enumerate(prompts):
                engine.submit(p, SamplingParams(max_tokens=7), i)
            got.wait(range(3))
        finally:
            engine.stop()
        assert [got.tokens(i) for i in range(3)] == [ref(p, 7) for p in prompts]
