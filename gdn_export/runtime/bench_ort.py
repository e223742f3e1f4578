"""Prefill and decode latency of an exported file on ONNX Runtime (gdn_export.runtime.ort_runner.
OrtRunner: native kernels where they apply, IOBinding on device buffers on CUDA): what
`gdn-export bench --runtime ort` measures.

    result = bench_ort(runner, batch=1, prompt_len=512, decode_steps=32, warmup=1, repeats=3, seed=0)

One run is a prefill of random prompts [batch, prompt_len] from empty states, then decode_steps
steps feeding the prompts' last token. run_with_iobinding returns once the logits are on the host,
so the host clock measures the device's work too. Keys: prefill_ms (median), decode_ms_per_step
(median over runs of each run's mean), decode_tokens_per_s, kernels, kernels_note.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from gdn_export.errors import InputError


def median_ms(fn, repeats: int) -> float:
    """Median wall-clock milliseconds of `repeats` calls of fn()."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def check_fits(runner, prompt_len: int, decode_steps: int) -> None:
    """InputError when the prompt and the decode steps exceed the file's in-place K/V cache."""
    need = prompt_len + decode_steps
    if runner.layout.inplace and not runner.layout.streaming and need > runner.layout.cache_len:
        raise InputError(f"--prompt-len + --decode-steps = {need} exceeds the file's cache of "
                         f"{runner.layout.cache_len} slots (export with --max-cache-len {need})")


def bench_ort(runner, *, batch: int, prompt_len: int, decode_steps: int, warmup: int, repeats: int,
              seed: int = 0) -> dict:
    """Time `runner` (an OrtRunner) as the module docstring says; returns the result keys."""
    check_fits(runner, prompt_len, decode_steps)
    ids = np.random.default_rng(seed).integers(0, runner.vocab_size, (batch, prompt_len), dtype=np.int64)
    token = ids[:, -1:]
    state = {}

    def prefill():
        state["s"] = runner.forward(ids, 0, runner.empty_states(batch))[1]

    def decode():
        s = state["s"]
        for i in range(decode_steps):
            s = runner.forward(token, prompt_len + i, s)[1]
        state["s"] = s

    for _ in range(warmup):
        prefill()
        decode()
    prefill_ms = median_ms(prefill, repeats)
    decode_ms = []
    for _ in range(repeats):
        prefill()
        decode_ms.append(median_ms(decode, 1) / decode_steps)
    step = statistics.median(decode_ms)
    return {"kernels": runner.kernels, "kernels_note": runner.kernels_note, "prefill_ms": prefill_ms,
            "decode_ms_per_step": step, "decode_tokens_per_s": 1e3 * batch / step}
