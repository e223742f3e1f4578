"""`gdn-export bench CHECKPOINT --quant fp8|int4-awq`: the 16-bit checkpoint and its quantized form,
side by side in one run.

The quantized model is made in-process by the pipeline of `gdn-export quantize` (ModelOpt
calibration on --device with the built-in calibration data, or --calib-data; the quantized
checkpoint written to a temporary folder, loaded back by the ordinary loader and deleted at the
end), so what is timed is what a user deploys. Order: quantize, time the 16-bit model and record
its greedy tokens, free it, time the quantized model and compare it with those tokens; peak memory
is therefore each model's own.

JSON: the 16-bit run's keys at the top level, as without --quant, and under "quant":

    format, calibration {samples, seq_len, data, seconds}, the same timing / memory keys for the
    quantized model, ratios {decode_ms_per_step, prefill_ms, peak_memory_bytes, weights_bytes}
    (quantized / 16-bit), and vs_16bit {logits_rel_rms (last prompt position), greedy_agreement
    (fraction of --quant-steps, default 64, teacher-forced greedy steps whose argmax equals the 16-bit model's),
    greedy_steps} over the benchmark's own prompts (gdn_export.quantize.accuracy).
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from pathlib import Path

from gdn_export.cli.common import check_at_least
from gdn_export.errors import InputError

STEPS = 64  # default teacher-forced greedy steps of the accuracy comparison
RATIO_KEYS = ("decode_ms_per_step", "prefill_ms", "peak_memory_bytes", "weights_bytes")


def add_arguments(p) -> None:
    from gdn_export.quantize.calib_data import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN

    p.add_argument("--quant", default=None, metavar="{fp8,int4-awq}",
                   help="also quantize the checkpoint in-process (as `gdn-export quantize --format`, "
                   "calibrating on --device) and time it beside the 16-bit model, with ratios and its "
                   "accuracy against the 16-bit model (default: none)")
    # None when not given: without --quant they are refused rather than ignored (QUANT_ONLY)
    p.add_argument("--quant-steps", type=int, default=None, metavar="N",
                   help=f"--quant: teacher-forced greedy steps of the accuracy comparison (default {STEPS})")
    p.add_argument("--quantize-lm-head", action="store_true", default=None,
                   help="--quant fp8: quantize the lm_head too (as `gdn-export quantize --quantize-lm-head`)")
    p.add_argument("--calib-data", default=None, metavar="FILE",
                   help="--quant: calibration text or token ids, as for quantize (default: the built-in "
                   "calibration data)")
    p.add_argument("--calib-samples", type=int, default=None,
                   help=f"--quant: calibration rows (default {DEFAULT_SAMPLES})")
    p.add_argument("--calib-seq-len", type=int, default=None,
                   help=f"--quant: tokens per calibration row (default {DEFAULT_SEQ_LEN})")


QUANT_ONLY = ("quant_steps", "calib_data", "calib_samples", "calib_seq_len", "quantize_lm_head")


def check_unused(args) -> None:
    """Without --quant, a --quant-steps / --calib-* flag would be ignored: refused, naming it."""
    for name in QUANT_ONLY:
        if getattr(args, name) is not None:
            raise InputError(f"--{name.replace('_', '-')} applies with --quant only")


def check(args) -> None:
    """One-line InputError / GdnExportError for a --quant run that cannot work, before any work."""
    from gdn_export.quantize import FORMATS
    from gdn_export.quantize.calibrate import modelopt_version
    from gdn_export.quantize.pipeline import check_not_quantized

    if args.quant not in FORMATS:
        raise InputError(f"--quant {args.quant!r} is not one of {', '.join(FORMATS)}")
    from gdn_export.quantize.pipeline import LM_HEAD_FORMATS

    if args.quantize_lm_head and args.quant not in LM_HEAD_FORMATS:
        raise InputError(f"--quantize-lm-head applies to --quant {' / '.join(LM_HEAD_FORMATS)}, not {args.quant}")
    for flag, on in (("--accuracy", args.accuracy), ("--compare-hf", args.compare_hf)):
        if on:
            raise InputError(f"{flag} does not combine with --quant (which reports the quantized model's "
                             f"accuracy against the 16-bit one)")
    from gdn_export.quantize.calib_data import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN, check_calibration_file

    defaults = (("quant_steps", STEPS), ("calib_samples", DEFAULT_SAMPLES), ("calib_seq_len", DEFAULT_SEQ_LEN))
    for name, default in defaults:
        if getattr(args, name) is None:
            setattr(args, name, default)
        check_at_least(getattr(args, name), 1, f"--{name.replace('_', '-')}")
    if args.calib_data is not None:
        check_calibration_file(args.calib_data)
    check_not_quantized(Path(args.checkpoint))
    modelopt_version()  # ModelOpt missing: said now, not after the 16-bit run


def model_weights(model) -> tuple[int, int]:
    """(parameters, bytes) of model's weights: its nn.Parameters (tied ones once) and the quantized
    layers' buffers (fp8 / int4 weights and their scales); quantized weights count in_features *
    out_features parameters."""
    from gdn_export.modules.quant_linear import QuantLinear
    from gdn_export.runtime.bench import tensor_bytes

    params = list({id(p): p for p in model.parameters()}.values())
    count = sum(p.numel() for p in params)
    tensors = list(params)
    for m in model.modules():
        if isinstance(m, QuantLinear):
            count += m.in_features * m.out_features
            tensors.extend(b for b in m.buffers(recurse=False) if b is not None)
    return count, tensor_bytes(tensors)


def run(args, result: dict, ids, setup) -> int:
    """Quantize, bench both models, compare; print the table, write --json. Returns 0."""
    from gdn_export.cli.bench import _table, write_json, measure
    from gdn_export.quantize.accuracy import runner_compare, runner_greedy
    from gdn_export.quantize.pipeline import quantize_checkpoint

    progress, prompts = setup.progress, ids.cpu().numpy()
    tmp = Path(tempfile.mkdtemp(prefix="gdn-export-bench-quant-"))
    try:
        t0 = time.perf_counter()
        progress(f"quantizing {args.checkpoint} to {args.quant} on {setup.device} (temporary folder {tmp})")
        qpath = quantize_checkpoint(args.checkpoint, tmp / "quantized", args.quant, calib_data=args.calib_data,
                                    samples=args.calib_samples, seq_len=args.calib_seq_len, progress=progress,
                                    device=setup.device, lm_head=bool(args.quantize_lm_head))
        calibration = {"samples": args.calib_samples, "seq_len": args.calib_seq_len,
                       "data": args.calib_data or "default", "seconds": time.perf_counter() - t0}
        gc.collect()

        runner, model = measure(args, args.checkpoint, ids, setup, result, label=args.dtype)
        progress(f"{args.dtype}: {args.quant_steps} greedy steps for the accuracy reference")
        reference = runner_greedy(runner, prompts, args.quant_steps)
        del runner, model
        gc.collect()

        quant: dict = {"format": args.quant + ("+lm_head" if args.quantize_lm_head else ""),
                       "calibration": calibration}
        runner, model = measure(args, qpath, ids, setup, quant, label=args.quant)
        progress(f"{args.quant}: {args.quant_steps} teacher-forced steps against the {args.dtype} model")
        quant["vs_16bit"] = runner_compare(runner, prompts, reference)
        del runner, model
        gc.collect()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    quant["ratios"] = {k: quant[k] / result[k] for k in RATIO_KEYS if result.get(k)}
    result["quant"] = quant
    print(table(result, _table))
    if args.json:
        write_json(result, Path(args.json))
        progress(f"wrote {args.json}")
    return 0


def table(result: dict, base_table) -> str:
    """bench's table with a row for each model, then the ratios and the accuracy."""
    q, dtype = result["quant"], result["dtype"]
    r, acc = q["ratios"], q["vs_16bit"]
    lines = [base_table(result, [(f"gdn-export {dtype}", result), (f"gdn-export {q['format']}", q)]),
             f"{q['format']} weights {q['weights_bytes'] / 2**20:.1f} MiB; calibration {q['calibration']['samples']} "
             f"x {q['calibration']['seq_len']} tokens ({q['calibration']['data']}), {q['calibration']['seconds']:.1f} s",
             f"{q['format']} / {dtype}: decode {r['decode_ms_per_step']:.3f}x, prefill {r['prefill_ms']:.3f}x, "
             f"peak memory {r['peak_memory_bytes']:.3f}x, weights {r['weights_bytes']:.3f}x",
             f"{q['format']} vs {dtype}: last-position logits rel RMS {acc['logits_rel_rms']:.4f}, greedy agreement "
             f"{acc['greedy_agreement']:.3f} over {acc['greedy_steps']} teacher-forced steps"]
    return "\n".join(lines)
