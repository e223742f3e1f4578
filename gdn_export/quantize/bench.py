"""The 16-bit checkpoint and its quantized form timed side by side in one run (`gdn-export bench
--quant`).

    quant = bench_quantized(checkpoint, "fp8", ids, setup, result, steps=64, calib_data=None,
                            calib_samples=..., calib_seq_len=...)

The quantized model is made in-process by the pipeline of `gdn-export quantize` (ModelOpt
calibration on setup.device with the built-in calibration data, or calib_data; the quantized
checkpoint written to a temporary folder, loaded back by the ordinary loader and deleted at the
end), so what is timed is what a user deploys. Order: quantize, time the 16-bit model (its keys
into `result`) and record its greedy tokens, free it, time the quantized model and compare it with
those tokens; peak memory is therefore each model's own.

Returned keys: format, calibration {samples, seq_len, data, seconds}, the timing / memory keys of
gdn_export.runtime.bench_checkpoint.measure for the quantized model, ratios {decode_ms_per_step,
prefill_ms, peak_memory_bytes, weights_bytes} (quantized / 16-bit), and vs_16bit {logits_rel_rms
(last prompt position), greedy_agreement (fraction of `steps` teacher-forced greedy steps whose
argmax equals the 16-bit model's), greedy_steps} over the benchmark's own prompts
(gdn_export.quantize.accuracy).
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from pathlib import Path

STEPS = 64  # default teacher-forced greedy steps of the accuracy comparison
RATIO_KEYS = ("decode_ms_per_step", "prefill_ms", "peak_memory_bytes", "weights_bytes")


def bench_quantized(checkpoint, fmt: str, ids, setup, result: dict, *, steps: int = STEPS, calib_data=None,
                    calib_samples: int, calib_seq_len: int, lm_head: bool = False) -> dict:
    """Quantize `checkpoint` to `fmt` (lm_head: the vocabulary projection too, fp8), time both models on
    prompts ids [B, T] (setup: a gdn_export.runtime.bench_checkpoint.Setup) and compare them (module
    docstring)."""
    from gdn_export.quantize.accuracy import runner_compare, runner_greedy
    from gdn_export.quantize.pipeline import quantize_checkpoint
    from gdn_export.runtime.bench_checkpoint import measure

    progress, prompts = setup.progress, ids.cpu().numpy()
    tmp = Path(tempfile.mkdtemp(prefix="gdn-export-bench-quant-"))
    try:
        t0 = time.perf_counter()
        progress(f"quantizing {checkpoint} to {fmt} on {setup.device} (temporary folder {tmp})")
        qpath = quantize_checkpoint(checkpoint, tmp / "quantized", fmt, calib_data=calib_data,
                                    samples=calib_samples, seq_len=calib_seq_len, progress=progress,
                                    device=setup.device, lm_head=lm_head)
        calibration = {"samples": calib_samples, "seq_len": calib_seq_len,
                       "data": calib_data or "default", "seconds": time.perf_counter() - t0}
        gc.collect()

        runner, model = measure(checkpoint, ids, setup, result, label=setup.dtype_name)
        progress(f"{setup.dtype_name}: {steps} greedy steps for the accuracy reference")
        reference = runner_greedy(runner, prompts, steps)
        del runner, model
        gc.collect()

        quant: dict = {"format": fmt + ("+lm_head" if lm_head else ""), "calibration": calibration}
        runner, model = measure(qpath, ids, setup, quant, label=fmt)
        progress(f"{fmt}: {steps} teacher-forced steps against the {setup.dtype_name} model")
        quant["vs_16bit"] = runner_compare(runner, prompts, reference)
        del runner, model
        gc.collect()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    quant["ratios"] = {k: quant[k] / result[k] for k in RATIO_KEYS if result.get(k)}
    return quant
