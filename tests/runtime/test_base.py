"""Runner interface: input checks and greedy generation (ragged rows, chunked prefill), on a toy
numpy runner with an in-place cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_export.errors import InputError
from gdn_export.layout import DeployLayout
from gdn_export.modules.kv_cache import slot_of
from gdn_export.runtime.base import Runner, StateInfo, check_states, generate

VOCAB = 11


class CountingRunner(Runner):
    """Logits favour (token + 1) mod V at each row's last real token; one in-place "key" cache of
    `cache_len` slots that records which tokens each row wrote where."""

    backend = "toy"

    def __init__(self, layout=None):
        self.layout = layout or DeployLayout.make(cache_len=16)
        self.vocab_size = VOCAB
        L = self.layout.cache_len if self.layout.inplace else "past"
        self.state_specs = [StateInfo("past.0.key", "present.0.key", ("batch", 1, L, 1), "float32", 0, "key")]
        self.calls = []

    def empty_states(self, batch):
        return [np.full(self.state_specs[0].concrete_shape(batch, 0), -1, np.float32)]

    def _forward(self, input_ids, past_lengths, seq_lens, states):
        B, T = input_ids.shape
        check_states(self.state_specs, [(s.shape, s.dtype.name) for s in states], B, int(past_lengths[0]))
        self.calls.append((input_ids.copy(), past_lengths.tolist(), seq_lens.tolist()))
        cache = states[0]
        if not self.layout.inplace:
            cache = np.concatenate([cache, np.zeros((B, 1, T, 1), np.float32)], axis=2)
        slots = slot_of(torch.from_numpy(past_lengths), self.layout).numpy() if self.layout.inplace \
            else past_lengths
        for b in range(B):
            cache[b, 0, slots[b]:slots[b] + seq_lens[b], 0] = input_ids[b, :seq_lens[b]]
        last = input_ids[np.arange(B), np.maximum(seq_lens - 1, 0)]
        logits = np.zeros((B, 1, VOCAB), np.float32)
        logits[np.arange(B), 0, (last + 1) % VOCAB] = 1.0
        return logits, [cache]

    def states_to_numpy(self, states):
        return {"past.0.key": states[0]}


def test_generate_greedy_tokens_and_step_logits():
    runner = CountingRunner()
    seen = []
    result = generate(runner, [[3, 4, 5], [9, 10, 0]], 4,
                      on_step=lambda i, tok: seen.append((i, tok[:, 0].tolist())))
    assert result.generated.tolist() == [[6, 7, 8, 9], [1, 2, 3, 4]]
    assert [r.tolist() for r in result.rows()] == [[3, 4, 5, 6, 7, 8, 9], [9, 10, 0, 1, 2, 3, 4]]
    assert result.generated.dtype == np.int64 and result.prompt_lengths.tolist() == [3, 3]
    assert [lg.shape for lg in result.step_logits] == [(2, 1, VOCAB)] * 4
    assert seen == [(0, [6, 1]), (1, [7, 2]), (2, [8, 3]), (3, [9, 4])]
    assert [past for _, past, _ in runner.calls] == [[0, 0], [3, 3], [4, 4], [5, 5]]


def test_ragged_rows_decode_at_their_own_positions():
    runner = CountingRunner()
    result = generate(runner, [[3], [1, 2, 3, 4, 5], [7, 8]], 3)
    assert result.generated.tolist() == [[4, 5, 6], [6, 7, 8], [9, 10, 0]]
    ids, past, lens = runner.calls[0]
    assert ids.tolist() == [[3, 0, 0, 0, 0], [1, 2, 3, 4, 5], [7, 8, 0, 0, 0]]
    assert (past, lens) == ([0, 0, 0], [1, 5, 2])
    assert [c[1] for c in runner.calls[1:]] == [[1, 5, 2], [2, 6, 3]]


def test_chunked_prefill_feeds_each_row_until_its_end():
    runner = CountingRunner()
    result = generate(runner, [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10]], 1, prefill_chunk=3)
    assert [(c[1], c[2]) for c in runner.calls] == [([0, 0], [3, 3]), ([3, 3], [3, 0]), ([6, 3], [1, 0])]
    assert result.generated.tolist() == [[8], [0]]


def test_streaming_prefill_stops_at_the_ring_end():
    runner = CountingRunner(DeployLayout.make(sinks=1, window=4))
    generate(runner, [list(range(1, 11))], 2)
    assert [(c[1], c[2]) for c in runner.calls] == [([0], [5]), ([5], [4]), ([9], [1]), ([10], [1])]


def test_prompt_plus_generation_longer_than_the_cache_is_refused_before_running():
    runner = CountingRunner()
    with pytest.raises(InputError, match="needs 17 cache slots; the model has 16"):
        generate(runner, [[1] * 10], 8)
    assert runner.calls == []


def test_concat_layout_refuses_ragged_rows():
    runner = CountingRunner(DeployLayout.make(kv_cache="concat"))
    with pytest.raises(InputError, match="need the inplace kv cache layout"):
        generate(runner, [[1, 2], [3]], 2)
    assert generate(runner, [[1, 2], [3, 4]], 2).generated.tolist() == [[3, 4], [5, 6]]


def test_generate_zero_new_tokens_runs_the_prefill_only():
    runner = CountingRunner()
    result = generate(runner, np.array([[1, 2]]), 0)
    assert result.generated.shape == (1, 0) and len(result.step_logits) == 1
    assert len(runner.calls) == 1


@pytest.mark.parametrize("ids,message", [
    (np.zeros((1, 0), np.int64), "empty"),
    (np.zeros((0, 4), np.int64), "empty"),
    (np.zeros((1, 2, 3), np.int64), "2-D"),
    ([[1, VOCAB]], f"token id {VOCAB} is out of range for vocab size {VOCAB}"),
    ([[-1, 2]], "token id -1 is out of range"),
    ([[1.0, 2.0]], "must be integers"),
], ids=["no-tokens", "no-rows", "3-D", "id=vocab", "id=-1", "float-ids"])
def test_bad_input_ids(ids, message):
    runner = CountingRunner()
    with pytest.raises(InputError, match=message):
        generate(runner, ids, 2)
    with pytest.raises(InputError, match=message):
        runner.forward(ids, 0, runner.empty_states(1))
    assert runner.calls == []


@pytest.mark.parametrize("past,lens,message", [
    ([-1, 0], None, r"past_lengths must be >= 0, got \[-1, 0\]"),
    ([0, 0, 0], None, r"past_lengths must have one entry per row \(2\)"),
    (0, [3, 1], r"seq_lens must be \[0, 2\], got \[3, 1\]"),
    (0, [1.5, 1], "seq_lens must be integers"),
    (15, None, r"rows at past lengths \[15, 15\] plus 2 tokens exceed the cache of 16 slots"),
], ids=["negative-past", "past-count", "len-above-width", "float-len", "overflow"])
def test_bad_lengths(past, lens, message):
    runner = CountingRunner()
    with pytest.raises(InputError, match=message):
        runner.forward(np.ones((2, 2), np.int64), past, runner.empty_states(2), lens)
    assert runner.calls == []


@pytest.mark.parametrize("states,message", [
    ([np.zeros((2, 1, 3, 1), np.float32)], r"must be \(2, 1, 16, 1\) for batch 2"),
    ([np.zeros((1, 1, 16, 1), np.float32)], "for batch 2"),
    ([np.zeros((2, 1, 16, 1), np.float64)], "must be float32, got float64"),
    ([], "expected 1 state tensors, got 0"),
], ids=["wrong-length", "wrong-batch", "float64", "missing"])
def test_bad_states(states, message):
    runner = CountingRunner()
    with pytest.raises(InputError, match=message):
        runner.forward(np.ones((2, 1), np.int64), 2, states)


@pytest.mark.parametrize("value", [-1, 1.5, True], ids=["negative", "float", "bool"])
def test_bad_counts(value):
    runner = CountingRunner()
    with pytest.raises(InputError, match="max_new_tokens"):
        generate(runner, [[1]], value)
    with pytest.raises(InputError, match="prefill chunk"):
        generate(runner, [[1]], 1, prefill_chunk=value if value != 1.5 else 0)
