"""`gdn-export bench CHECKPOINT --quant fp8|int4-awq`: the flags, checks and table of the 16-bit
checkpoint and its quantized form side by side in one run (measured by gdn_export.quantize.bench,
which says what is timed and in which order).

JSON: the 16-bit run's keys at the top level, as without --quant, and under "quant" the keys
gdn_export.quantize.bench.bench_quantized returns: format, calibration, the quantized model's
timing / memory keys, ratios and vs_16bit.
"""

from __future__ import annotations

from pathlib import Path

from gdn_export.cli.bench_common import quant_table, write_json
from gdn_export.cli.common import check_at_least
from gdn_export.errors import InputError
from gdn_export.quantize.bench import STEPS, bench_quantized


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


def run(args, result: dict, ids, setup) -> int:
    """Quantize, bench both models, compare (gdn_export.quantize.bench); print the table, write
    --json. Returns 0."""
    result["quant"] = bench_quantized(args.checkpoint, args.quant, ids, setup, result, steps=args.quant_steps,
                                      calib_data=args.calib_data, calib_samples=args.calib_samples,
                                      calib_seq_len=args.calib_seq_len,
                                      lm_head=bool(args.quantize_lm_head))
    print(quant_table(result))
    if args.json:
        write_json(result, Path(args.json), args.overwrite)
        setup.progress(f"wrote {args.json}")
    return 0
