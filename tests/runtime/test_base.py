"""Runner interface: input checks and greedy generation, on a toy numpy runner."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_export.errors import InputError
from gdn_export.runtime.base import Runner, StateInfo, check_states, generate

VOCAB = 11


class CountingRunner(Runner):
    """Logits favour (token + 1) mod V; one K/V-like state that grows by T per call."""

    backend = "toy"

    def __init__(self):
        self.vocab_size = VOCAB
        self.state_specs = [StateInfo("past.0.key", "present.0.key", ("batch", 1, "past", 2), "float32",
                                      0, "key")]
        self.calls = []

    def empty_states(self, batch):
        return [np.zeros((batch, 1, 0, 2), np.float32)]

    def _forward(self, input_ids, past_len, states):
        B, T = input_ids.shape
        check_states(self.state_specs, [(s.shape, s.dtype.name) for s in states], B, past_len)
        self.calls.append((input_ids.copy(), past_len))
        logits = np.zeros((B, T, VOCAB), np.float32)
        np.put_along_axis(logits, ((input_ids + 1) % VOCAB)[..., None], 1.0, axis=-1)
        grown = np.concatenate([states[0], np.ones((B, 1, T, 2), np.float32)], axis=2)
        return logits, [grown]

    def states_to_numpy(self, states):
        return {"past.0.key": states[0]}


def test_generate_greedy_tokens_and_step_logits():
    runner = CountingRunner()
    seen = []
    result = generate(runner, [[3, 4, 5], [9, 10, 0]], 4,
                      on_step=lambda i, tok: seen.append((i, tok[:, 0].tolist())))
    assert result.tokens.tolist() == [[3, 4, 5, 6, 7, 8, 9], [9, 10, 0, 1, 2, 3, 4]]
    assert result.tokens.dtype == np.int64
    assert [lg.shape for lg in result.step_logits] == [(2, 3, VOCAB)] + [(2, 1, VOCAB)] * 3
    assert seen == [(0, [6, 1]), (1, [7, 2]), (2, [8, 3]), (3, [9, 4])]
    assert [past for _, past in runner.calls] == [0, 3, 4, 5]


def test_generate_zero_new_tokens_runs_the_prefill_only():
    runner = CountingRunner()
    result = generate(runner, np.array([[1, 2]]), 0)
    assert result.tokens.tolist() == [[1, 2]] and len(result.step_logits) == 1
    assert len(runner.calls) == 1


@pytest.mark.parametrize("ids,message", [
    (np.zeros((1, 0), np.int64), "empty"),
    (np.zeros((0, 4), np.int64), "empty"),
    ([1, 2, 3], "2-D"),
    (np.zeros((1, 2, 3), np.int64), "2-D"),
    ([[1, VOCAB]], f"token id {VOCAB} is out of range for vocab size {VOCAB}"),
    ([[-1, 2]], "token id -1 is out of range"),
    ([[1.0, 2.0]], "must be integers"),
], ids=["no-tokens", "no-rows", "1-D", "3-D", "id=vocab", "id=-1", "float-ids"])
def test_bad_input_ids(ids, message):
    runner = CountingRunner()
    with pytest.raises(InputError, match=message):
        generate(runner, ids, 2)
    with pytest.raises(InputError, match=message):
        runner.forward(ids, 0, runner.empty_states(1))
    assert runner.calls == []


@pytest.mark.parametrize("states,past,message", [
    ([np.zeros((2, 1, 3, 2), np.float32)], 2, r"must be \(2, 1, 2, 2\) for batch 2 and past length 2"),
    ([np.zeros((1, 1, 2, 2), np.float32)], 2, "for batch 2"),
    ([np.zeros((2, 1, 2, 2), np.float64)], 2, "must be float32, got float64"),
    ([], 0, "expected 1 state tensors, got 0"),
], ids=["wrong-past", "wrong-batch", "float64", "missing"])
def test_bad_states(states, past, message):
    runner = CountingRunner()
    with pytest.raises(InputError, match=message):
        runner.forward(np.ones((2, 1), np.int64), past, states)


@pytest.mark.parametrize("value", [-1, 1.5, True], ids=["negative", "float", "bool"])
def test_bad_counts(value):
    runner = CountingRunner()
    with pytest.raises(InputError, match="past_len"):
        runner.forward([[1]], value, runner.empty_states(1))
    with pytest.raises(InputError, match="max_new_tokens"):
        generate(runner, [[1]], value)
