"""The engine's bookkeeping on the host: which request sits in which state row, what waits, and the
bounds (`Limits`). It moves no tensors; it says which rows to copy (`Moves`) and the engine copies.

A request (`Sequence`) waits in a FIFO queue, is admitted into a prefill row (a row of the staging
states), is prefilled there in chunks, and with its first token moves to a decode row (a row of the
pool the decode steps run on) until it finishes or is cancelled. Both row sets are kept compact:
the sequences of a set occupy its rows 0..n-1 in order, so that a model call runs on the first n
rows (row slices of contiguous tensors are views: no gather); when a row empties, the set's last
sequence moves into it.

Admission is first come, first served, while the running sequences (prefilling and decoding) stay
under max_num_seqs, the prefilling ones under max_prefill_seqs, and the tokens they reserve (prompt
plus max_tokens each) under max_cached_tokens; a request that does not fit waits, and the ones
behind it wait too (no overtaking, so no starvation). The queue holds at most max_queue requests.
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gdn_export.errors import InputError
from gdn_export.serve.errors import BadRequest, QueueFull
from gdn_export.serve.sampling import SamplingParams

WAITING, PREFILL, DECODE, DONE = "waiting", "prefill", "decode", "done"


@dataclass(frozen=True)
class Limits:
    """max_num_seqs: running sequences (the decode pool's rows); max_prefill_seqs: sequences
    prefilled together (the staging rows); max_cached_tokens: prompt + max_tokens reserved by the
    running sequences together (None: max_num_seqs x the cache length); max_queue: waiting
    requests; prefill_tokens: tokens of one prefill call (rows x chunk width)."""

    max_num_seqs: int = 64
    max_prefill_seqs: int = 8
    max_cached_tokens: int | None = None
    max_queue: int = 512
    prefill_tokens: int = 2048

    def check(self) -> None:
        """InputError naming the first limit below its minimum."""
        for name, value in (("max_num_seqs", self.max_num_seqs), ("max_prefill_seqs", self.max_prefill_seqs),
                            ("max_queue", self.max_queue), ("prefill_tokens", self.prefill_tokens),
                            ("max_cached_tokens", self.max_cached_tokens or 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass(eq=False)
class Sequence:
    """One request inside the engine. prompt int64 [P]; generated: the tokens picked so far (the
    last one not yet in the cache while decoding); `sink` is the caller's, handed back with every
    output. Times are time.perf_counter() seconds."""

    id: int
    prompt: np.ndarray
    params: SamplingParams
    sink: Any
    arrival: float = field(default_factory=time.perf_counter)
    phase: str = WAITING
    row: int = -1
    prefilled: int = 0  # prompt tokens in the cache
    generated: list[int] = field(default_factory=list)
    cancelled: bool = False
    launched: int = 0  # decode steps launched for it (their tokens may still be on the way)
    first_token_at: float | None = None
    last_token_at: float | None = None
    generator: Any = None  # torch.Generator of a seeded request, made at admission

    @property
    def reserved(self) -> int:
        """Cache slots this sequence may fill: its prompt plus max_tokens."""
        return len(self.prompt) + self.params.max_tokens

    @property
    def next_position(self) -> int:
        """Where its next decode step runs: after the prompt and the steps launched before."""
        return self.prefilled + self.launched


@dataclass
class Moves:
    """Row copies to make, in this order: `promote` (staging row -> pool row), then `staging` and
    `pool` (src row -> dst row within the set). Each list's sources and destinations are distinct."""

    promote: list[tuple[int, int]] = field(default_factory=list)
    staging: list[tuple[int, int]] = field(default_factory=list)
    pool: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class PrefillPlan:
    """One prefill call over staging rows 0..len(chunks)-1: `width` tokens per row (right-padded),
    chunks[i] real tokens of row i (>= 1)."""

    width: int
    chunks: list[int]


class Scheduler:
    """Queue, rows and bounds (module docstring) for a cache of `cache_len` slots per sequence.
    Not thread-safe: the engine holds its lock around every call."""

    def __init__(self, limits: Limits, cache_len: int):
        limits.check()
        self.limits = limits
        self.cache_len = cache_len
        self.max_cached_tokens = limits.max_cached_tokens or limits.max_num_seqs * cache_len
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.prefilling: list[Sequence] = []
        self.decoding: list[Sequence] = []
        self.reserved = 0
        self._seconds_per_request = 1.0  # a running mean, for Retry-After

    # ------------------------------------------------------------------ arrivals
    def check_fits(self, prompt_len: int, max_tokens: int, param: str = "max_tokens") -> None:
        """BadRequest unless a prompt of prompt_len tokens plus max_tokens fits one sequence's cache
        and the cached-token bound."""
        if prompt_len < 1:
            raise BadRequest("the prompt is empty: give at least one token", param="prompt")
        need = prompt_len + max_tokens
        room = min(self.cache_len, self.max_cached_tokens)
        if need > room:
            what = (f"the cache holds {self.cache_len} tokens per sequence (--max-model-len)"
                    if room == self.cache_len else f"--max-cached-tokens is {self.max_cached_tokens}")
            raise BadRequest(f"this model's maximum context length is {room} tokens; the prompt has "
                             f"{prompt_len} tokens and max_tokens asks for {max_tokens} more ({need}): "
                             f"{what}", param=param, code="context_length_exceeded")

    def enqueue(self, seq: Sequence) -> None:
        """Append to the queue, or QueueFull (with a Retry-After guess) at max_queue."""
        if len(self.waiting) >= self.limits.max_queue:
            raise QueueFull(f"the queue is full ({self.limits.max_queue} requests waiting, --max-queue); "
                            f"retry later", retry_after=self.retry_after())
        self.waiting.append(seq)

    def retry_after(self) -> int:
        """Seconds until the queue has likely drained by one batch: 1..60."""
        batches = len(self.waiting) / self.limits.max_num_seqs
        return int(min(60, max(1, math.ceil(batches * self._seconds_per_request))))

    def admit(self) -> list[Sequence]:
        """Move waiting sequences into prefill rows, first come first served, within the bounds.
        Cancelled ones at the head are dropped on the way (they are returned too, phase DONE)."""
        admitted = []
        lim = self.limits
        while self.waiting:
            seq = self.waiting[0]
            if seq.cancelled:
                self.waiting.popleft()
                seq.phase = DONE
                admitted.append(seq)
                continue
            if (len(self.prefilling) >= lim.max_prefill_seqs or self.running >= lim.max_num_seqs
                    or self.reserved + seq.reserved > self.max_cached_tokens):
                break
            self.waiting.popleft()
            seq.phase, seq.row = PREFILL, len(self.prefilling)
            self.prefilling.append(seq)
            self.reserved += seq.reserved
            admitted.append(seq)
        return admitted

    @property
    def running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    # ------------------------------------------------------------------ prefill
    def prefill_plan(self) -> PrefillPlan:
        """The next prefill call: prefill_tokens // rows tokens per row at most, no more than the
        longest remainder, and no row past the end of its cache (the call's width counts for every
        row, padded ones too)."""
        rows = self.prefilling
        left = [len(s.prompt) - s.prefilled for s in rows]
        room = min(self.cache_len - s.prefilled for s in rows)
        width = max(1, min(self.limits.prefill_tokens // len(rows), max(left), room))
        return PrefillPlan(width, [min(n, width) for n in left])

    def promote(self, seqs: list[Sequence]) -> Moves:
        """Prefilled sequences (with their first token) move to the end of the decode rows."""
        moves = Moves()
        for seq in seqs:
            moves.promote.append((seq.row, len(self.decoding)))
            seq.phase, seq.row = DECODE, len(self.decoding)
            self.decoding.append(seq)
        moves.staging = self._compact(self.prefilling, {m[0] for m in moves.promote})
        return moves

    # ------------------------------------------------------------------ leaving
    def remove(self, seqs: list[Sequence], now: float | None = None) -> Moves:
        """Finished or cancelled sequences leave their rows (or the queue); their tokens are no
        longer reserved."""
        moves = Moves()
        gone = {PREFILL: set(), DECODE: set()}
        for seq in seqs:
            if seq.phase == WAITING:
                self.waiting.remove(seq)
            elif seq.phase in gone:
                gone[seq.phase].add(seq.row)
                self.reserved -= seq.reserved
                if now is not None and not seq.cancelled:
                    self._seconds_per_request += 0.1 * (now - seq.arrival - self._seconds_per_request)
            seq.phase = DONE
        moves.staging = self._compact(self.prefilling, gone[PREFILL])
        moves.pool = self._compact(self.decoding, gone[DECODE])
        return moves

    @staticmethod
    def _compact(rows: list[Sequence], gone: set[int]) -> list[tuple[int, int]]:
        """Drop rows `gone` from `rows` in place, moving the last survivors into the holes.
        Returns the (src, dst) row copies."""
        if not gone:
            return []
        keep = len(rows) - len(gone)
        holes = sorted(r for r in gone if r < keep)
        movers = [r for r in range(keep, len(rows)) if r not in gone]
        for src, dst in zip(movers, holes):
            rows[dst] = rows[src]
            rows[dst].row = dst
        del rows[keep:]
        return list(zip(movers, holes))
