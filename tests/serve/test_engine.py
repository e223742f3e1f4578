"""The engine against each prompt run alone: whatever else shares the batch (arrivals while others
decode, prompts longer than a prefill call, a full decode pool, cancellations, stop ids), every
request's greedy tokens are the eager runner's for that prompt alone. All four families of make-tiny
and a quantized (published fine-grained FP8) checkpoint."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from gdn_export.serve.errors import BadRequest, EngineFailure, QueueFull, Unavailable
from gdn_export.serve.sampling import SamplingParams
from gdn_export.serve.scheduler import Limits
from tests.serve.conftest import CACHE_LEN, Reference, fast_runner, make_tiny, start_engine, until_stop

# Prompt lengths: one token, a few, longer than a prefill call (prefill_tokens 24 over 2 rows: 12
# each), up to 90. Four decode rows for eight requests: some wait, some arrive while others decode.
LENGTHS = (1, 5, 13, 40, 90, 7, 26, 3)
MAX_TOKENS = (6, 11, 1, 9, 12, 8, 5, 10)
LIMITS = Limits(max_num_seqs=4, max_prefill_seqs=2, prefill_tokens=24, max_queue=16)


def _prompts(seed: int, vocab: int):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n) for n in LENGTHS]


def _wait_for_tokens(collector, sink, count: int = 1, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while len(collector.tokens(sink)) < count and sink not in collector.finished:
        assert time.monotonic() < deadline, f"no tokens for {sink}"
        time.sleep(0.002)


def _check_against_reference(ckpt, kv_scales=None):
    runner = fast_runner(ckpt, kv_scales=kv_scales)
    ref = Reference(ckpt, kv_scales=kv_scales)
    prompts = _prompts(3, runner.vocab_size)
    # Request 6 stops at a token of its own reference (a stop id); 3 is cancelled while it decodes.
    stop_at = ref(prompts[6], MAX_TOKENS[6])[2]
    params = [SamplingParams(max_tokens=m, stop_token_ids=frozenset({stop_at}) if i == 6 else frozenset())
              for i, m in enumerate(MAX_TOKENS)]
    engine, got = start_engine(runner, LIMITS)
    try:
        seqs = {i: engine.submit(prompts[i], params[i], i) for i in range(4)}
        _wait_for_tokens(got, 0)  # the rest arrive while the first ones decode
        for i in range(4, 8):
            seqs[i] = engine.submit(prompts[i], params[i], i)
        _wait_for_tokens(got, 3, 2)
        engine.cancel(seqs[3])
        got.wait(range(8))
        assert engine.idle and engine.stats() == {"waiting": 0, "prefill": 0, "decode": 0, "reserved_tokens": 0}
    finally:
        engine.stop()
    for i, prompt in enumerate(prompts):
        want = ref(prompt, MAX_TOKENS[i])
        tokens, last = got.tokens(i), got.finished[i]
        if i == 3:
            assert last.finish_reason == "cancelled" and 2 <= len(tokens) < MAX_TOKENS[3]
            assert tokens == want[:len(tokens)], i
        elif i == 6:
            assert tokens == until_stop(want, {stop_at}) and last.finish_reason == "stop" and last.stop_token
        else:
            assert tokens == want and last.finish_reason == "length", (i, tokens, want)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", "qwen3_5_moe", "olmo_hybrid"])
def test_every_request_gets_the_tokens_of_its_prompt_alone(tmp_path, family):
    _check_against_reference(make_tiny(tmp_path / family, family, tokenizer=False))


def test_quantized_checkpoint_and_fp8_cache(tmp_path):
    """Published fine-grained FP8 weights (as Qwen ships them), and the K/V cache in FP8."""
    from tests.weights.fp8_checkpoints import to_published_fp8

    src = make_tiny(tmp_path / "bf", "qwen3_5", tokenizer=False)
    to_published_fp8(src, tmp_path / "fp8")
    # an FP8 K/V cache too: float8 state rows, copied and zeroed as bytes (make-tiny: attention in layer 3)
    _check_against_reference(tmp_path / "fp8", kv_scales={3: (0.011, 0.004)})


def test_warm_up_runs_each_prefill_shape_class_and_leaves_zero_rows(tiny_ckpt):
    """warm_up: row counts 1, 2 and max_prefill_seqs, a first and a continuation chunk each, ragged
    rows, within the cache; the staging rows zero afterwards (a request's rows start from zero)."""
    import torch

    runner = fast_runner(tiny_ckpt)
    calls = []
    step = runner.step

    def recording_step(ids, past, lens, states):
        calls.append((tuple(ids.shape), past.tolist(), lens.tolist()))
        return step(ids, past, lens, states)

    runner.step = recording_step
    from gdn_export.serve.engine import Engine

    engine = Engine(runner, Limits(max_num_seqs=4, max_prefill_seqs=5, prefill_tokens=40), deliver=lambda out: None)
    for t in engine.staging:
        t.view(torch.uint8).fill_(7)
    assert engine.warm_up() == len(calls) == 6
    widths = {1: 40, 2: 20, 5: 8}
    for (m, w), past, lens in calls:
        assert m in widths and past == [past[0]] * m and past[0] in (0, widths[m])
        assert w == (widths[m] if past[0] == 0 else widths[m] - 1)
        assert lens == [max(1, w - i) for i in range(m)] and past[0] + w <= engine.cache_len
    assert all(not t.view(torch.uint8).any() for t in engine.staging)


def test_rows_are_reused_and_kept_compact(tiny_ckpt):
    """More requests than rows, many times over: every row is reused, the staging and pool sets stay
    compact, and the answers stay exact (a stale state in a reused row would change them)."""
    runner = fast_runner(tiny_ckpt)
    ref = Reference(tiny_ckpt)
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, runner.vocab_size, int(n)) for n in rng.integers(1, 30, 24)]
    engine, got = start_engine(runner, Limits(max_num_seqs=3, max_prefill_seqs=2, prefill_tokens=16, max_queue=32))
    try:
        for i, p in enumerate(prompts):
            engine.submit(p, SamplingParams(max_tokens=1 + i % 5), i)
        got.wait(range(len(prompts)))
    finally:
        engine.stop()
    for i, p in enumerate(prompts):
        assert got.tokens(i) == ref(p, 1 + i % 5), i


def test_bad_requests_and_a_full_queue(tiny_ckpt):
    runner = fast_runner(tiny_ckpt, cache_len=32)
    engine, got = start_engine(runner, Limits(max_num_seqs=1, max_prefill_seqs=1, max_queue=1))
    gate = threading.Event()
    step = runner.step
    runner.step = lambda *a: (gate.wait(30), step(*a))[1]  # hold the first prefill
    try:
        with pytest.raises(BadRequest, match=r"maximum context length is 32 tokens; the prompt has 30 tokens and "
                                             r"max_tokens asks for 3 more \(33\)"):
            engine.submit(np.ones(30, np.int64), SamplingParams(max_tokens=3), "long")
        with pytest.raises(BadRequest, match=r"token id 256 is outside the vocabulary \[0, 256\)"):
            engine.submit([1, 256], SamplingParams(), "oov")
        with pytest.raises(BadRequest, match="the prompt is empty"):
            engine.submit([], SamplingParams(), "empty")
        engine.submit([1, 2], SamplingParams(max_tokens=2), "a")  # admitted, its prefill held
        deadline = time.monotonic() + 10
        while engine.stats()["waiting"]:
            assert time.monotonic() < deadline
            time.sleep(0.002)
        engine.submit([3], SamplingParams(max_tokens=2), "b")  # waits: the one row is taken
        with pytest.raises(QueueFull, match=r"the queue is full \(1 requests waiting") as full:
            engine.submit([4], SamplingParams(), "c")
        assert full.value.status == 429 and 1 <= int(full.value.headers()["Retry-After"]) <= 60
        gate.set()
        got.wait(["a", "b"])
        engine.begin_drain()
        with pytest.raises(Unavailable, match="shutting down") as draining:
            engine.submit([5], SamplingParams(), "d")
        assert draining.value.status == 503
    finally:
        gate.set()
        engine.stop()
    assert [o.finish_reason for o in (got.finished["a"], got.finished["b"])] == ["length", "length"]


def test_a_failing_step_fails_its_requests_only(tiny_ckpt):
    """A model call that raises fails the requests in it (500, EngineFailure); the engine goes on and
    serves the next ones exactly."""
    runner = fast_runner(tiny_ckpt)
    ref = Reference(tiny_ckpt)
    engine, got = start_engine(runner, Limits(max_num_seqs=4, max_prefill_seqs=4))
    decode = runner.decode_rows
    failing = threading.Event()
    failing.set()

    def flaky(tokens, past):
        if failing.is_set():
            failing.clear()
            raise RuntimeError("injected fault")
        return decode(tokens, past)

    runner.decode_rows = flaky
    try:
        for name in ("x", "y"):
            engine.submit([5, 6, 7], SamplingParams(max_tokens=4), name)
        got.wait(["x", "y"])
        for name in ("x", "y"):
            error = got.finished[name].error
            assert isinstance(error, EngineFailure) and error.status == 500
            assert "the decode step failed: RuntimeError: injected fault" in error.message
        engine.submit([5, 6, 7], SamplingParams(max_tokens=4), "z")
        got.wait(["z"])
        # a failure outside the model calls (here the admission, once): the queue waits, the engine goes on
        admit = engine.sched.admit
        admit_fails = threading.Event()
        admit_fails.set()

        def flaky_admit():
            if admit_fails.is_set():
                admit_fails.clear()
                raise RuntimeError("injected bookkeeping fault")
            return admit()

        engine.sched.admit = flaky_admit
        engine.submit([5, 6], SamplingParams(max_tokens=3), "w")
        got.wait(["w"])
    finally:
        engine.stop()
    assert got.tokens("z") == ref([5, 6, 7], 4) and got.tokens("w") == ref([5, 6], 3)
    assert engine.dead is None


def test_stop_fails_what_is_left(tiny_ckpt):
    runner = fast_runner(tiny_ckpt)
    engine, got = start_engine(runner, Limits(max_num_seqs=1, max_prefill_seqs=1))
    engine.submit([1, 2, 3], SamplingParams(max_tokens=CACHE_LEN - 3), "long")
    _wait_for_tokens(got, "long")
    engine.abort_all("going away")
    got.wait(["long"])
    engine.stop()
    assert isinstance(got.finished["long"].error, Unavailable) and "going away" in got.finished["long"].error.message
    assert engine.idle
