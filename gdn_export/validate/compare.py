"""Numerical parity between runners: same prompts, same forced tokens, every tensor compared.

The reference runner (normally the PyTorch model) drives the tokens: after the prefill, each decode
step feeds the reference's greedy token to every runner, so that all of them see identical inputs
and a small logit difference can never snowball into a different token sequence. With the in-place
K/V layout the rows are ragged by default (lengths from prompt_len down to 1), so that padding is
checked too; the concat layout needs equal rows.
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
# Added per recurrent-state dtype: two implementations that round the same fp32 state to 16 bits may
# land one unit apart, and each decode step rounds again. Over validate's default run (4 decode
# steps) a 16-bit state moves the logits from the fp32 state's by <= 1.3e-3 (fp16) / 1.1e-2 (bf16)
# relative RMS, tiny model and 1.66B-class widths alike; over hundreds of steps of the wider model
# it levels off at 3.6e-3 / 2.9e-2 (docs/perf/gdn.md, "Recurrent state dtype: accuracy"): long
# validations of such models need wider tolerances than these.
STATE_DTYPE_TOLERANCES = {
    "float32": (0.0, 0.0),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}


def default_tolerances(model_dtype: str, state_dtype: str = "float32") -> tuple[float, float]:
    """(atol, rtol) for a model of `model_dtype` with its recurrent state stored in `state_dtype`."""
    atol, rtol = DEFAULT_TOLERANCES[model_dtype]
    extra_atol, extra_rtol = STATE_DTYPE_TOLERANCES[state_dtype]
    return atol + extra_atol, rtol + extra_rtol


@dataclass
class Row:
    """One compared tensor. `note` says why a row failed without numbers ("missing": the
    candidate has no such state; the errors are then NaN)."""

    backend: str
    phase: str
    tensor: str
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    passed: bool
    note: str = ""


@dataclass
class Report:
    reference: str
    batch: int
    prompt_len: int
    decode_steps: int
    seed: int
    rows: list[Row] = field(default_factory=list)
    prompt_lengths: list[int] = field(default_factory=list)  # per row (ragged runs)

    @property
    def passed(self) -> bool:
        """Every row within tolerance; a report that compared nothing has not passed."""
        return bool(self.rows) and all(r.passed for r in self.rows)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        return d


@dataclass
class Tolerances:
    """Default (atol, rtol) plus per-tensor overrides keyed by row name: "logits" or a state's
    input name such as "past.0.conv" (rows name states past.LAYER.KIND, never present.*).

    `step` (atol, rtol), with per-tensor `step_per_tensor`: a second, looser bound for one known
    cause the first cannot hold, named by `step_note` (static FP8 activations, where an activation on
    an e4m3 rounding boundary rounds one step apart in two implementations:
    gdn_export.quantize.report.rounding_step). A row over (atol, rtol) but within the step bound
    passes with that note, and the report says how many did; None: no second bound."""

    atol: float
    rtol: float
    per_tensor: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    step: tuple[float, float] | None = None
    step_note: str = ""
    step_per_tensor: dict[str, tuple[float, float]] = field(default_factory=dict)

    def get(self, name: str) -> tuple[float, float]:
        a, r = self.per_tensor.get(name, (None, None))
        return (self.atol if a is None else a), (self.rtol if r is None else r)

    def get_step(self, name: str) -> tuple[float, float] | None:
        if self.step is None:
            return None
        return self.step_per_tensor.get(name, self.step)


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


def check_parity_sizes(batch: int, prompt_len: int, decode_steps: int,
                       spelling: dict[str, str] | None = None) -> None:
    """InputError unless batch >= 1, prompt_len >= 1 and decode_steps >= 0 (all integers).

    `spelling` maps a parameter name to the caller's (e.g. {"decode_steps": "--decode-steps"}),
    so that a command line can check early and name its own flags.
    """
    spelling = spelling or {}
    for name, value, low in (("batch", batch, 1), ("prompt_len", prompt_len, 1),
                             ("decode_steps", decode_steps, 0)):
        label = spelling.get(name, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise InputError(f"{label} must be an integer, got {value!r}")
        if value < low:
            raise InputError(f"{label} must be >= {low}, got {value}")


def random_prompts(vocab_size: int, batch: int, prompt_len: int, seed: int) -> np.ndarray:
    """Token ids [batch, prompt_len] int64, uniform in [0, vocab_size), from `seed`."""
    check_parity_sizes(batch, prompt_len, 0)
    return np.random.default_rng(seed).integers(0, vocab_size, size=(batch, prompt_len), dtype=np.int64)


def ragged_lengths(batch: int, prompt_len: int) -> list[int]:
    """Row lengths spread from prompt_len down to 1 (one row: prompt_len)."""
    if batch == 1:
        return [prompt_len]
    return [int(round(prompt_len - (prompt_len - 1) * b / (batch - 1))) for b in range(batch)]


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
    ragged: bool | None = None,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Prefill `batch` random prompts, then `decode_steps` forced steps, on every runner.

    ragged (default: when every runner has the in-place layout): row lengths from `ragged_lengths`.
    Compares the logits of each step and every state after the prefill and after the last step.
    A state of the reference that a candidate lacks is a failed row with note "missing".
    """
    from gdn_export.runtime.base import prefill

    check_parity_sizes(batch, prompt_len, decode_steps)
    say = progress or (lambda _msg: None)
    runners = [reference, *candidates]
    if ragged is None:
        ragged = all(r.layout.inplace for r in runners)
    lens = ragged_lengths(batch, prompt_len) if ragged else [prompt_len] * batch
    ids = random_prompts(vocab_size, batch, prompt_len, seed)
    prompts = [row[:n] for row, n in zip(ids, lens)]
    report = Report(reference.backend, batch, prompt_len, decode_steps, seed, prompt_lengths=lens)
    past = np.array(lens, np.int64)
    say(f"prefill of rows of {', '.join(map(str, lens))} tokens: {', '.join(r.backend for r in runners)}")
    outs = [prefill(r, prompts, r.empty_states(batch)) for r in runners]
    for step in range(decode_steps + 1):
        phase = "prefill" if step == 0 else f"decode {step}"
        if step:
            say(f"{phase}: {', '.join(r.backend for r in runners)}")
            outs = [r.forward(token, past, s) for r, (_, s) in zip(runners, outs)]
            past += 1
        ref_logits = outs[0][0]
        last = step in (0, decode_steps)
        ref_states = reference.states_to_numpy(outs[0][1]) if last else {}
        for runner, (logits, new_states) in zip(candidates, outs[1:]):
            add_row(report, runner.backend, phase, "logits", logits, ref_logits, tolerances)
            if last:
                got = runner.states_to_numpy(new_states)
                for name, expected in ref_states.items():
                    if name in got:
                        add_row(report, runner.backend, phase, name, got[name], expected, tolerances)
                    else:
                        atol, rtol = tolerances.get(name)
                        report.rows.append(Row(runner.backend, phase, name, float("nan"),
                                               float("nan"), atol, rtol, False, "missing"))
        final = ref_logits[np.arange(batch), past - 1] if step == 0 and ref_logits.shape[1] > 1 \
            else ref_logits[:, -1]
        token = final.argmax(-1)[:, None].astype(np.int64)
    return report


def add_row(report: Report, backend: str, phase: str, name: str, actual, expected, tolerances: Tolerances) -> None:
    """Append the Row comparing `actual` with `expected` (same shape) at the tolerances of `name`
    (a row over them but within the step bound passes with the step's note: Tolerances)."""
    atol, rtol = tolerances.get(name)
    actual, expected = np.asarray(actual), np.asarray(expected)
    max_abs, max_rel, ok = compare(actual, expected, atol, rtol)
    note = ""
    step = tolerances.get_step(name)
    if not ok and step is not None and compare(actual, expected, max(atol, step[0]), max(rtol, step[1]))[2]:
        ok, note = True, tolerances.step_note
    report.rows.append(Row(backend, phase, name, max_abs, max_rel, atol, rtol, ok, note))
