"""End-to-end timing and accuracy of a checkpoint: our fast runner, and transformers beside it.

Every measurement runs `repeats` times after `warmup` untimed runs and reports the median. One run
is a prefill of the prompts [B, T] from empty states followed by `decode_steps` greedy decode steps
(each row feeds back its own argmax). Times are wall clock between device synchronisations:

    prefill_ms          the whole prefill (all chunks), until its last logits are on the device
    decode_ms_per_step  the decode steps' time / decode_steps (no host sync between steps)
    decode_tokens_per_s B / decode_ms_per_step * 1000

Accuracy (`accuracy`): the same prompts, then `steps` decode steps forced to the fp32 model's
greedy tokens, so every model sees the same inputs; the logits of the prefill's last token and of
every step are compared with the fp32 model's: relative RMS over all of them, and the fraction of
(row, step) whose argmax agrees.
"""

from __future__ import annotations

import inspect
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from gdn_export.errors import GdnExportError


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timings:
    """Medians in ms of `repeats` runs (see module docstring), and every run's values."""

    batch: int
    decode_steps: int
    prefill_runs_ms: list[float] = field(default_factory=list)
    decode_runs_ms: list[float] = field(default_factory=list)
    # CUDA allocator peaks (None on the CPU): from the caller's last reset to the first run, then
    # over every prefill and every decode of the runs (time_runs resets the counter between them)
    earlier_peak_bytes: int | None = None
    prefill_peak_bytes: int | None = None
    decode_peak_bytes: int | None = None

    @property
    def prefill_ms(self) -> float:
        return statistics.median(self.prefill_runs_ms)

    @property
    def decode_ms_per_step(self) -> float:
        return statistics.median(self.decode_runs_ms) / self.decode_steps

    @property
    def decode_tokens_per_s(self) -> float:
        return self.batch / self.decode_ms_per_step * 1e3

    def as_dict(self) -> dict:
        return {"prefill_ms": self.prefill_ms, "decode_ms_per_step": self.decode_ms_per_step,
                "decode_tokens_per_s": self.decode_tokens_per_s,
                "prefill_runs_ms": self.prefill_runs_ms,
                "decode_runs_ms_per_step": [t / self.decode_steps for t in self.decode_runs_ms]}


def time_runs(prefill: Callable[[], object], decode: Callable[[object], None], device: torch.device,
              batch: int, decode_steps: int, warmup: int, repeats: int,
              progress: Callable[[str], None] | None = None, label: str = "") -> Timings:
    """Run prefill() then decode(prefill's result) warmup + repeats times, timing both; on CUDA also
    the allocator's peak of each phase (the peak counter is reset before each, outside the timing)."""
    out = Timings(batch, decode_steps)
    cuda = device.type == "cuda"
    if cuda:
        out.earlier_peak_bytes = torch.cuda.max_memory_allocated(device)
    for i in range(warmup + repeats):
        sync(device)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        state = prefill()
        sync(device)
        t1 = time.perf_counter()
        if cuda:
            out.prefill_peak_bytes = max(out.prefill_peak_bytes or 0, torch.cuda.max_memory_allocated(device))
            torch.cuda.reset_peak_memory_stats(device)
            t1 = time.perf_counter()
        if decode_steps:
            decode(state)
        sync(device)
        t2 = time.perf_counter()
        if cuda:
            out.decode_peak_bytes = max(out.decode_peak_bytes or 0, torch.cuda.max_memory_allocated(device))
        if i >= warmup:
            out.prefill_runs_ms.append((t1 - t0) * 1e3)
            out.decode_runs_ms.append((t2 - t1) * 1e3)
        if progress:
            kind = "warm-up" if i < warmup else "run"
            progress(f"{label}{kind} {i + 1 - (warmup if i >= warmup else 0)}: prefill "
                     f"{(t1 - t0) * 1e3:.2f} ms, decode {(t2 - t1) * 1e3 / max(decode_steps, 1):.3f} ms/step")
    return out


# ------------------------------------------------------------------------------ ours


def bench_runner(runner, ids: torch.Tensor, decode_steps: int, warmup: int, repeats: int,
                 prefill_chunk: int | None = None, progress=None) -> Timings:
    """Time a GraphRunner (gdn_export.runtime.cuda_graph) on prompts ids [B, T] (device int64)."""
    B, T = ids.shape

    def prefill():
        logits, states = runner.prefill_device(ids, runner.empty_states(B), prefill_chunk)
        return logits[:, -1].argmax(-1)[:, None], states

    def decode(state):
        token, states = state
        runner.decode_greedy(token, np.full(B, T, np.int64), states, decode_steps)

    return time_runs(prefill, decode, runner.device, B, decode_steps, warmup, repeats, progress, "ours ")


def forced_logits_ours(runner, prompts: np.ndarray, forced: np.ndarray) -> np.ndarray:
    """[S + 1, B, V] fp32: logits at the prompts' last token, then after each forced token
    (forced [B, S]) through the Runner interface."""
    from gdn_export.runtime.base import prefill

    B, T = prompts.shape
    logits, states = prefill(runner, list(prompts), runner.empty_states(B))
    out = [logits[:, -1]]
    for s in range(forced.shape[1]):
        logits, states = runner.forward(forced[:, s:s + 1], T + s, states)
        out.append(logits[:, -1])
    return np.stack(out)


# ------------------------------------------------------------------------------ transformers


def load_hf(path, dtype: torch.dtype, device: torch.device):
    """transformers' AutoModelForCausalLM of checkpoint `path`, or GdnExportError saying why not."""
    try:
        import transformers
    except ImportError as exc:
        raise GdnExportError(f"transformers is not installed ({exc})") from exc
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except Exception as exc:  # unknown family, missing modules: one line for the table
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise GdnExportError(f"transformers cannot load {path}: {first}") from exc
    return model.to(device).eval()


def _hf_step(model, ids, cache):
    """One transformers call with its cache; the argument and output are called `cache` from
    transformers 5.2x (`past_key_values` before). Returns (logits [B, 1, V], cache)."""
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    kwargs = {} if cache is None else {name: cache}
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **kwargs)
    return out.logits, getattr(out, name)


@torch.no_grad()
def bench_hf(model, ids: torch.Tensor, decode_steps: int, warmup: int, repeats: int,
             progress=None) -> Timings:
    """Time transformers' prefill + greedy decode with its own cache (same protocol as ours)."""
    B = ids.shape[0]

    def prefill():
        logits, cache = _hf_step(model, ids, None)
        return logits[:, -1].argmax(-1, keepdim=True), cache

    def decode(state):
        token, cache = state
        for _ in range(decode_steps):
            logits, cache = _hf_step(model, token, cache)
            token = logits[:, -1].argmax(-1, keepdim=True)

    return time_runs(prefill, decode, ids.device, B, decode_steps, warmup, repeats, progress, "transformers ")


@torch.no_grad()
def forced_logits_hf(model, prompts: np.ndarray, forced: np.ndarray, device) -> np.ndarray:
    """forced_logits_ours for a transformers model."""
    out, cache = _hf_step(model, torch.from_numpy(prompts).to(device), None)
    logits = [out[:, -1].float().cpu().numpy()]
    for s in range(forced.shape[1]):
        out, cache = _hf_step(model, torch.from_numpy(forced[:, s:s + 1]).to(device), cache)
        logits.append(out[:, -1].float().cpu().numpy())
    return np.stack(logits)


# ------------------------------------------------------------------------------ comparison


def compare_logits(actual: np.ndarray, expected: np.ndarray) -> dict:
    """{"rel_rms": ||a - e|| / ||e|| (float64), "argmax_agreement": fraction of equal argmaxes}."""
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    rel = float(np.linalg.norm(a - e) / max(np.linalg.norm(e), 1e-30))
    agree = float((a.argmax(-1) == e.argmax(-1)).mean())
    return {"rel_rms": rel, "argmax_agreement": agree}


def peak_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, source): the CUDA allocator's peak since the last reset, or the process's peak RSS
    on the CPU (which includes the Python interpreter and libraries)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "process peak RSS"


def peak_memory_through(timings: Timings, device: torch.device) -> tuple[int, str]:
    """peak_memory(device) since the caller's last reset, through `timings`' runs: time_runs resets
    the CUDA counter between its phases and keeps each phase's peak in `timings`."""
    peak, source = peak_memory(device)
    if device.type == "cuda":
        peak = max(peak, timings.earlier_peak_bytes, timings.prefill_peak_bytes, timings.decode_peak_bytes)
    return peak, source


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def tensor_bytes(tensors) -> int:
    """Bytes of distinct tensors (tied weights counted once)."""
    seen, total = set(), 0
    for t in tensors:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total
