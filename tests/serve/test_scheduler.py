"""The scheduler's bookkeeping, without a model: admission within every bound, first come first
served, compact rows (the moves that keep them so), the prefill plan's widths, and the errors."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_export.errors import InputError
from gdn_export.serve.errors import BadRequest, QueueFull
from gdn_export.serve.sampling import SamplingParams
from gdn_export.serve.scheduler import DECODE, DONE, PREFILL, Limits, Scheduler, Sequence


def _seq(i: int, prompt: int = 4, max_tokens: int = 4) -> Sequence:
    return Sequence(i, np.zeros(prompt, np.int64), SamplingParams(max_tokens=max_tokens), sink=i)


def test_admission_respects_every_bound_in_order():
    s = Scheduler(Limits(max_num_seqs=3, max_prefill_seqs=2, max_cached_tokens=30, max_queue=8), cache_len=20)
    seqs = [_seq(0), _seq(1), _seq(2, 10, 10), _seq(3), _seq(4)]
    for q in seqs:
        s.enqueue(q)
    assert s.admit() == seqs[:2]  # two prefill rows
    assert [q.row for q in seqs[:2]] == [0, 1] and s.reserved == 16
    s.promote(seqs[:2])
    assert [q.phase for q in seqs[:2]] == [DECODE, DECODE] and s.prefilling == []
    # seq 2 needs 20 tokens: 16 + 20 > 30, so it waits, and seq 3 behind it waits too
    assert s.admit() == []
    s.remove([seqs[0]])
    assert s.admit() == [seqs[2]] and s.reserved == 28
    assert s.admit() == []  # three running: the bound of rows
    assert list(s.waiting) == seqs[3:]


def test_rows_stay_compact():
    s = Scheduler(Limits(max_num_seqs=6, max_prefill_seqs=6), cache_len=64)
    seqs = [_seq(i) for i in range(6)]
    for q in seqs:
        s.enqueue(q)
    s.admit()
    moves = s.promote([seqs[1], seqs[4]])
    assert moves.promote == [(1, 0), (4, 1)]
    # rows 1 and 4 left the staging set of 6: row 5 moves into hole 1, row 4 was itself leaving
    assert moves.staging == [(5, 1)] and [q.row for q in s.prefilling] == [0, 1, 2, 3]
    assert s.prefilling == [seqs[0], seqs[5], seqs[2], seqs[3]]
    s.promote([seqs[0], seqs[5], seqs[2], seqs[3]])
    assert [q.id for q in s.decoding] == [1, 4, 0, 5, 2, 3]
    moves = s.remove([seqs[1], seqs[5], seqs[3]])  # decode rows 0, 3, 5
    assert moves.pool == [(4, 0)] and [q.id for q in s.decoding] == [2, 4, 0]
    assert [q.row for q in s.decoding] == [0, 1, 2] and all(q.phase == DONE for q in (seqs[1], seqs[5], seqs[3]))
    assert s.reserved == 3 * 8


def test_prefill_plan_splits_the_token_budget_and_stops_at_the_cache_end():
    s = Scheduler(Limits(max_num_seqs=4, max_prefill_seqs=3, prefill_tokens=24), cache_len=50)
    a, b = _seq(0, 40, 1), _seq(1, 5, 1)
    s.enqueue(a), s.enqueue(b), s.admit()
    plan = s.prefill_plan()
    assert (plan.width, plan.chunks) == (12, [12, 5])
    a.prefilled, b.prefilled = 36, 5
    assert s.prefill_plan().chunks == [4, 0]
    s.remove([b])
    a.prefilled = 0
    assert s.prefill_plan().width == 24  # alone: the whole budget
    a.prefilled = 30  # 20 slots left in its cache: the call's width stops there
    a.prompt = np.zeros(49, np.int64)
    assert s.prefill_plan().width == 19


def test_errors():
    s = Scheduler(Limits(max_num_seqs=2, max_queue=1, max_cached_tokens=40), cache_len=64)
    with pytest.raises(BadRequest, match="maximum context length is 40 tokens; the prompt has 30 tokens and "
                                         r"max_tokens asks for 11 more \(41\): --max-cached-tokens is 40"):
        s.check_fits(30, 11)
    s.check_fits(30, 10)
    with pytest.raises(BadRequest, match="prompt is empty"):
        s.check_fits(0, 1)
    s.enqueue(_seq(0))
    with pytest.raises(QueueFull, match="the queue is full"):
        s.enqueue(_seq(1))
    with pytest.raises(InputError, match="max_queue must be an integer >= 1, got 0"):
        Scheduler(Limits(max_queue=0), 8)
    assert PREFILL != DECODE
