"""Numerical parity between runners: same prompts, same forced tokens, every tensor compared.

The reference runner (normally the PyTorch model) drives the tokens: after the prefill, each decode
step feeds the reference's greedy token to every runner, so that all of them see identical inputs
and a small logit difference can never snowball into a different token sequence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np

from gdn_export.errors import InputError

# (atol, rtol) per model dtype: |actual - expected| <= atol + rtol * |expected| element-wise.
DEFAULT_TOLERANCES = {
    "float32": (1e-4, 1e-3),
    "float16": (3e-2, 3e-2),
    "bfloat16": (8e-2, 8e-2),
}


@dataclass
class Row:
    backend: str
    phase: str
    tensor: str
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    passed: bool


@dataclass
class Report:
    reference: str
    batch: int
    prompt_len: int
    decode_steps: int
    seed: int
    rows: list[Row] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        return d


@dataclass
class Tolerances:
    """Default (atol, rtol) plus per-tensor overrides keyed by tensor name ("logits", "present.0.conv")."""

    atol: float
    rtol: float
    per_tensor: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)

    def get(self, name: str) -> tuple[float, float]:
        a, r = self.per_tensor.get(name, (None, None))
        return (self.atol if a is None else a), (self.rtol if r is None else r)


def compare(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> tuple[float, float, bool]:
    """(max abs error, max abs error / max |expected|, all within atol + rtol |expected|)."""
    if actual.shape != expected.shape:
        return float("inf"), float("inf"), False
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    if a.size == 0:
        return 0.0, 0.0, True
    if not np.isfinite(a).all():
        return float("nan"), float("nan"), False
    diff = np.abs(a - e)
    max_abs = float(diff.max())
    max_rel = max_abs / max(float(np.abs(e).max()), 1e-30)
    return max_abs, max_rel, bool((diff <= atol + rtol * np.abs(e)).all())


def random_prompts(vocab_size: int, batch: int, prompt_len: int, seed: int) -> np.ndarray:
    if batch < 1 or prompt_len < 1:
        raise InputError(f"--batch and --prompt-len must be >= 1, got {batch} and {prompt_len}")
    return np.random.default_rng(seed).integers(0, vocab_size, size=(batch, prompt_len), dtype=np.int64)


def run_parity(
    reference,
    candidates: Sequence,
    *,
    vocab_size: int,
    tolerances: Tolerances,
    batch: int = 2,
    prompt_len: int = 37,
    decode_steps: int = 4,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Prefill `batch` random prompts, then `decode_steps` forced steps, on every runner.

    Compares the logits of each step and every state after the prefill and after the last step.
    """
    say = progress or (lambda _msg: None)
    ids = random_prompts(vocab_size, batch, prompt_len, seed)
    report = Report(reference.backend, batch, prompt_len, decode_steps, seed)
    runners = [reference, *candidates]
    states = [r.empty_states(batch) for r in runners]
    past = 0
    for step in range(decode_steps + 1):
        phase = "prefill" if step == 0 else f"decode {step}"
        say(f"{phase}: {', '.join(r.backend for r in runners)}")
        outs = [r.forward(ids, past, s) for r, s in zip(runners, states)]
        states = [o[1] for o in outs]
        ref_logits = outs[0][0]
        last = step in (0, decode_steps)
        ref_states = reference.states_to_numpy(states[0]) if last else {}
        for runner, (logits, new_states) in zip(candidates, outs[1:]):
            _add(report, runner.backend, phase, "logits", logits, ref_logits, tolerances)
            if last:
                got = runner.states_to_numpy(new_states)
                for name, expected in ref_states.items():
                    _add(report, runner.backend, phase, name, got[name], expected, tolerances)
        past += ids.shape[1]
        ids = ref_logits[:, -1].argmax(-1)[:, None].astype(np.int64)
    return report


def _add(report, backend, phase, name, actual, expected, tolerances):
    atol, rtol = tolerances.get(name)
    max_abs, max_rel, ok = compare(np.asarray(actual), np.asarray(expected), atol, rtol)
    report.rows.append(Row(backend, phase, name, max_abs, max_rel, atol, rtol, ok))
