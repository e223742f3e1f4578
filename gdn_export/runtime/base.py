"""The runner interface shared by every backend, its input checks, and greedy generation.

A runner owns a model (PyTorch module, ONNX Runtime session, TensorRT engine) and steps it:

    states = runner.empty_states(B)               # zero GDN states, an empty K/V cache
    logits, states = runner.forward(ids, past_lengths, states, seq_lens)
        ids [B, T] int64, rows right-padded; past_lengths [B] (or one int): tokens each row has
        already seen; seq_lens [B]: real tokens per row (default T; 0 = the row sits the call out);
        logits fp32 [B, 1, V] at each row's last real token (layout.logits "last") or [B, T, V]

`runner.layout` (gdn_export.layout.DeployLayout) says how the model was shaped: in-place or
concatenated K/V cache, its length, streaming, which logits, the recurrent state dtype. States are
opaque to callers (torch tensors, numpy arrays, device buffers); `states_to_numpy` names them after
`state_specs` (past.{layer}.{kind}) for comparison. Token ids, lengths and states are checked before
anything runs; a bad one raises InputError with a one-line message.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from gdn_export.errors import InputError
from gdn_export.layout import DeployLayout
from gdn_export.modules.kv_cache import tokens_until_wrap
from gdn_export.runtime.memory import check_generation_memory

BATCH, PAST = "batch", "past"


@dataclass(frozen=True)
class StateInfo:
    """One state tensor: input `name` (past.{layer}.{kind}), output `output_name` (present.*),
    `shape` with "batch" / "past" for the dynamic dims, `dtype` name ("float32", "float16",
    "bfloat16"), `layer` and `kind` ("conv" | "recurrent" | "key" | "value")."""

    name: str
    output_name: str
    shape: tuple[int | str, ...]
    dtype: str
    layer: int
    kind: str

    def concrete_shape(self, batch: int, past: int = 0) -> tuple[int, ...]:
        """The shape with "batch" and "past" filled in."""
        return tuple(batch if d == BATCH else past if d == PAST else d for d in self.shape)


@dataclass
class GenerationResult:
    """prompts: the B prompts (1-D int64 arrays, lengths prompt_lengths [B]); generated [B, N] int64.

    step_logits[0] holds the prompt's logits: [B, 1, V] at each row's last prompt token (layout
    logits "last"), or [B, T, V] for every prompt position (layout "all"; T = the longest prompt,
    positions >= prompt_lengths[b] are 0); then one [B, 1, V] per decode step (step_logits[i] picked
    generated[:, i])."""

    prompts: list[np.ndarray]
    generated: np.ndarray
    step_logits: list[np.ndarray] = field(default_factory=list)

    @property
    def prompt_lengths(self) -> np.ndarray:
        return np.array([len(p) for p in self.prompts], dtype=np.int64)

    def rows(self) -> list[np.ndarray]:
        """Each row's prompt followed by its generated tokens."""
        return [np.concatenate([p, g]) for p, g in zip(self.prompts, self.generated)]


class Runner(abc.ABC):
    """One model on one backend. Subclasses set `backend`, `state_specs`, `vocab_size` and `layout`."""

    backend: str
    state_specs: list[StateInfo]
    vocab_size: int
    layout: DeployLayout

    @abc.abstractmethod
    def empty_states(self, batch: int) -> Any:
        """Prefill states for `batch` rows: zero GDN states, an empty K/V cache."""

    def forward(self, input_ids, past_lengths, states, seq_lens=None) -> tuple[np.ndarray, Any]:
        """Run one call (module docstring): input_ids [B, T], past_lengths int or [B], seq_lens
        None (= T) or [B]. Returns logits float32 ([B, 1, V] or [B, T, V]) and the new states."""
        ids = check_input_ids(input_ids, self.vocab_size)
        batch, seq = ids.shape
        past = check_lengths(past_lengths, batch, "past_lengths", 0, None)
        lens = np.full(batch, seq, np.int64) if seq_lens is None else \
            check_lengths(seq_lens, batch, "seq_lens", 0, seq)
        check_fits(self.layout, past, lens, seq)
        return self._forward(ids, past, lens, states)

    @abc.abstractmethod
    def _forward(self, input_ids: np.ndarray, past_lengths: np.ndarray, seq_lens: np.ndarray,
                 states) -> tuple[np.ndarray, Any]:
        """`forward` after the token ids and lengths were checked (lengths int64 [B])."""

    def default_prefill_chunk(self, batch: int, prompt_len: int | None = None) -> int | None:
        """Tokens per row per prefill call when the caller gives none, for `batch` rows of prompts of
        up to `prompt_len` tokens (None: as many as fit)."""
        return None

    @abc.abstractmethod
    def states_to_numpy(self, states) -> dict[str, np.ndarray]:
        """{state name: host array}; bfloat16 states come back as float32 (numpy has no bf16)."""


# ------------------------------------------------------------------------------ input checks


def check_input_ids(input_ids, vocab_size: int) -> np.ndarray:
    """input_ids as an int64 array [B, T], or InputError saying what is wrong with it."""
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise InputError(f"input_ids must be 2-D [batch, seq], got shape {ids.shape}")
    if ids.size == 0:
        raise InputError(f"input_ids is empty (shape {ids.shape}): give at least one token per row")
    if not np.issubdtype(ids.dtype, np.integer):
        raise InputError(f"input_ids must be integers, got {ids.dtype}")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise InputError(f"token id {bad} is out of range for vocab size {vocab_size} "
                         f"(0 .. {vocab_size - 1})")
    return ids.astype(np.int64, copy=False)


def check_lengths(values, batch: int, name: str, low: int, high: int | None) -> np.ndarray:
    """`values` (one int for every row, or [batch] integers) as int64 [batch] within [low, high],
    or InputError naming `name`."""
    arr = np.asarray(values)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise InputError(f"{name} must be integers, got {values!r}")
    if arr.ndim == 0:
        arr = np.full(batch, int(arr), np.int64)
    if arr.shape != (batch,):
        raise InputError(f"{name} must have one entry per row ({batch}), got shape {arr.shape}")
    if (arr < low).any() or (high is not None and (arr > high).any()):
        where = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise InputError(f"{name} must be {where}, got {arr.tolist()}")
    return arr.astype(np.int64, copy=False)


def check_fits(layout: DeployLayout, past: np.ndarray, seq_lens: np.ndarray, seq: int) -> None:
    """InputError unless a call of `seq` tokens at `past` fits the layout's cache (rows of the
    concat layout must be equal; in place, no row may run past the cache or across the ring)."""
    if not layout.inplace:
        if (past != past[0]).any() or (seq_lens != seq).any():
            raise InputError("rows of different lengths need the inplace kv cache layout; this model "
                             "was exported with --kv-cache concat")
        return
    room = tokens_until_wrap([int(p) for p in past], layout)
    if seq > room:
        if layout.streaming:
            raise InputError(f"a call of {seq} tokens would cross the end of the streaming cache "
                             f"({layout.cache_len} slots) at past lengths {past.tolist()}; split it")
        raise InputError(f"rows at past lengths {past.tolist()} plus {seq} tokens exceed the cache of "
                         f"{layout.cache_len} slots (export with a larger --max-cache-len or an "
                         f"--attention-window)")


def check_states(specs: Sequence[StateInfo], shapes_and_dtypes: Sequence[tuple[tuple[int, ...], str]],
                 batch: int, past_len: int) -> None:
    """Raise InputError for the first state whose count, shape or dtype does not match `specs`
    at this batch size and past length. States are given as (shape, dtype name) pairs so that
    every backend can describe its own tensors."""
    if len(shapes_and_dtypes) != len(specs):
        raise InputError(f"expected {len(specs)} state tensors, got {len(shapes_and_dtypes)}")
    for spec, (shape, dtype) in zip(specs, shapes_and_dtypes):
        want = spec.concrete_shape(batch, past_len)
        if tuple(shape) != want:
            raise InputError(f"state {spec.name} must be {want} for batch {batch} and past length "
                             f"{past_len}, got {tuple(shape)}")
        if dtype != spec.dtype:
            raise InputError(f"state {spec.name} must be {spec.dtype}, got {dtype}")


# ------------------------------------------------------------------------------- generation


def as_prompts(input_ids, vocab_size: int) -> list[np.ndarray]:
    """Prompts as a list of 1-D int64 arrays: from a [B, T] array, or from B sequences of their own
    lengths (each checked like input_ids)."""
    try:
        arr = np.asarray(input_ids)
    except ValueError:  # rows of different lengths
        arr = None
    if arr is not None and arr.dtype != object:
        return list(check_input_ids(arr, vocab_size))
    rows = list(input_ids)
    if not rows:
        raise InputError("no prompts given")
    return [check_input_ids(np.asarray(r).reshape(1, -1), vocab_size)[0] for r in rows]


def pad_rows(rows: Sequence[np.ndarray], width: int | None = None) -> np.ndarray:
    """[B, width] int64, row b's tokens first, then zeros (any valid id: padded tokens are inert)."""
    width = max(len(r) for r in rows) if width is None else width
    out = np.zeros((len(rows), width), np.int64)
    for b, r in enumerate(rows):
        out[b, :len(r)] = r[:width]
    return out


def prefill(runner: Runner, prompts: Sequence[np.ndarray], states, chunk: int | None = None):
    """Run the prompts (rows of any lengths) through `runner` from empty `states`, in calls of at
    most `chunk` tokens (default: the runner's `default_prefill_chunk`, else as many as the cache
    allows at once; streaming caches are filled up to the ring's end per call). Returns (logits,
    states): logits [B, 1, V] at each row's last prompt token, or [B, T, V] for every position when
    the runner's layout keeps all logits."""
    lens = np.array([len(p) for p in prompts], np.int64)
    batch, longest = len(prompts), int(lens.max())
    chunk = runner.default_prefill_chunk(batch, longest) if chunk is None else chunk
    layout = runner.layout
    past = np.zeros(batch, np.int64)
    last = full = None
    while (past < lens).any():
        room = tokens_until_wrap([int(p) for p in past], layout)
        if room <= 0:
            raise InputError(f"a prompt of {longest} tokens does not fit the cache of "
                             f"{layout.cache_len} slots")
        size = int(min(room, chunk or longest, (lens - past).max()))
        seq = np.minimum(lens - past, size)
        ids = pad_rows([p[o:o + size] for p, o in zip(prompts, past)], size)
        logits, states = runner.forward(ids, past, states, seq)
        if layout.logits == "all":
            if full is None:
                full = np.zeros((batch, longest, logits.shape[-1]), np.float32)
            for b in np.flatnonzero(seq):
                full[b, past[b]:past[b] + seq[b]] = logits[b, :seq[b]]
        else:
            last = logits.copy() if last is None else last
            rows = np.flatnonzero(seq)
            last[rows] = logits[rows]
        past += seq
    return (full if full is not None else last), states


def check_generation_fits(layout: DeployLayout, prompts: Sequence[np.ndarray], max_new_tokens: int) -> None:
    """InputError unless the prompts plus max_new_tokens fit the layout: equal rows for the concat
    layout, and no more tokens than the cache holds unless it streams."""
    lens = np.array([len(p) for p in prompts], np.int64)
    if not layout.inplace and (lens != lens[0]).any():
        raise InputError(f"prompts of different lengths {lens.tolist()} need the inplace kv cache "
                         f"layout; this model was exported with --kv-cache concat")
    needed = int(lens.max()) + max(max_new_tokens - 1, 0)
    if layout.inplace and not layout.streaming and needed > layout.cache_len:
        raise InputError(f"a prompt of {int(lens.max())} tokens plus {max_new_tokens} new tokens needs "
                         f"{needed} cache slots; the model has {layout.cache_len} (export with a larger "
                         f"--max-cache-len or an --attention-window)")


def generate(runner: Runner, input_ids, max_new_tokens: int,
             on_step: Callable[[int, np.ndarray], None] | None = None,
             prefill_chunk: int | None = None) -> GenerationResult:
    """Greedy decoding: prefill the prompts (input_ids [B, T], or B sequences of their own
    lengths), then pick max_new_tokens tokens per row, every row at its own position.

    on_step(i, tokens [B, 1]) is called with each new token as it is picked. The prefill always
    runs (its logits are step_logits[0], also when max_new_tokens = 0). A prompt plus generation
    that cannot fit a cache without a streaming window is an InputError before anything runs.
    """
    prompts = as_prompts(input_ids, runner.vocab_size)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
            or max_new_tokens < 0:
        raise InputError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if prefill_chunk is not None and (isinstance(prefill_chunk, bool) or prefill_chunk < 1):
        raise InputError(f"prefill chunk must be an integer >= 1, got {prefill_chunk!r}")
    check_generation_fits(runner.layout, prompts, max_new_tokens)
    check_generation_memory(runner, prompts, max_new_tokens)  # the cache is allocated whole, now
    lens = np.array([len(p) for p in prompts], np.int64)
    layout = runner.layout
    batch = len(prompts)
    logits, states = prefill(runner, prompts, runner.empty_states(batch), prefill_chunk)
    result = GenerationResult(prompts, np.zeros((batch, 0), np.int64), [logits])
    last = logits[np.arange(batch), lens - 1] if layout.logits == "all" else logits[:, -1]
    picked, past = [], lens.copy()
    for i in range(max_new_tokens):
        token = last.argmax(-1).astype(np.int64)[:, None]
        picked.append(token)
        if on_step is not None:
            on_step(i, token)
        if i + 1 == max_new_tokens:
            break
        logits, states = runner.forward(token, past, states)
        past += 1
        result.step_logits.append(logits)
        last = logits[:, -1]
    result.generated = np.concatenate(picked, axis=1) if picked else result.generated
    return result
