"""The runner interface shared by every backend, its input checks, and greedy generation.

A runner owns a model (PyTorch module, ONNX Runtime session, TensorRT engine) and steps it:

    states = runner.empty_states(B)                       # zero GDN states, P = 0 keys/values
    logits, states = runner.forward(ids, past_len, states)
        ids [B, T] int64, past_len = tokens already in the states (P), logits [B, T, V] fp32

States are opaque to callers (torch tensors, numpy arrays, device buffers); `states_to_numpy`
names them after `state_specs` (past.{layer}.{kind}) for comparison. Token ids and states are
checked before anything runs; a bad one raises InputError with a one-line message.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from gdn_export.errors import InputError

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
    """tokens [B, T + N] int64 (prompt then generated); step_logits[0] is the prefill's
    [B, T, V], then one [B, 1, V] per decode step (step_logits[i] picked token i + 1)."""

    tokens: np.ndarray
    step_logits: list[np.ndarray] = field(default_factory=list)


class Runner(abc.ABC):
    """One model on one backend. Subclasses set `backend`, `state_specs` and `vocab_size`."""

    backend: str
    state_specs: list[StateInfo]
    vocab_size: int

    @abc.abstractmethod
    def empty_states(self, batch: int) -> Any:
        """Prefill states for `batch` sequences: zero GDN states, P = 0 keys / values."""

    def forward(self, input_ids, past_len: int, states) -> tuple[np.ndarray, Any]:
        """Run T tokens per sequence: input_ids [B, T] int64 at positions past_len .. past_len+T-1.

        Returns logits [B, T, V] float32 and the new states (same kind as `states`).
        """
        ids = check_input_ids(input_ids, self.vocab_size)
        if isinstance(past_len, bool) or not isinstance(past_len, (int, np.integer)) or past_len < 0:
            raise InputError(f"past_len must be an integer >= 0, got {past_len!r}")
        return self._forward(ids, int(past_len), states)

    @abc.abstractmethod
    def _forward(self, input_ids: np.ndarray, past_len: int, states) -> tuple[np.ndarray, Any]:
        """`forward` after the token ids and past_len were checked."""

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


def generate(runner: Runner, input_ids, max_new_tokens: int,
             on_step: Callable[[int, np.ndarray], None] | None = None) -> GenerationResult:
    """Greedy decoding: prefill input_ids [B, T], then pick max_new_tokens tokens per row.

    on_step(i, tokens [B, 1]) is called with each new token as it is picked. The prefill always
    runs (its logits are step_logits[0], also when max_new_tokens = 0).
    """
    ids = check_input_ids(input_ids, runner.vocab_size)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
            or max_new_tokens < 0:
        raise InputError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    batch, past = ids.shape
    logits, states = runner.forward(ids, 0, runner.empty_states(batch))
    result = GenerationResult(tokens=ids, step_logits=[logits])
    picked = [ids]
    for i in range(max_new_tokens):
        token = logits[:, -1].argmax(-1).astype(np.int64)[:, None]
        picked.append(token)
        if on_step is not None:
            on_step(i, token)
        if i + 1 == max_new_tokens:
            break
        logits, states = runner.forward(token, past, states)
        past += 1
        result.step_logits.append(logits)
    result.tokens = np.concatenate(picked, axis=1)
    return result
