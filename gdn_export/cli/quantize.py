"""`gdn-export quantize CHECKPOINT -o OUT --format fp8|int4-awq`."""

from __future__ import annotations

from pathlib import Path

from gdn_export.cli.common import Progress, add_device, add_overwrite, add_quiet, checkpoint_dir, device_of, output_dir
from gdn_export.cli.runners import check_device
from gdn_export.paths import describe_folder
from gdn_export.errors import InputError


def add_parser(sub) -> None:
    from gdn_export.quantize.calib_data import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN

    p = sub.add_parser(
        "quantize", help="quantize a checkpoint (fp8 or int4-awq) with ModelOpt calibration",
        description="Calibrate a 16-bit checkpoint with NVIDIA ModelOpt and write it as a quantized "
        "checkpoint folder in ModelOpt's unified Hugging Face form, which export / run / validate / "
        "bench take like any other checkpoint.")
    p.add_argument("checkpoint", help="16-bit checkpoint folder (config.json + *.safetensors)")
    p.add_argument("-o", "--output", required=True, help="folder of the quantized checkpoint to write")
    p.add_argument("--format", required=True, metavar="{fp8,int4-awq}",
                   help="fp8: FP8 E4M3 weights per output channel and static per-tensor FP8 activations; "
                   "int4-awq: INT4 weights in groups of 128 with AWQ scales, 16-bit activations")
    p.add_argument("--calib-data", default=None, metavar="FILE",
                   help="calibration text (tokenized with the checkpoint's tokenizer) or token ids (.npy, "
                   "or whitespace-separated integers); default: a built-in English text, or seeded random "
                   "ids when the checkpoint has no tokenizer")
    p.add_argument("--calib-samples", type=int, default=DEFAULT_SAMPLES,
                   help=f"calibration rows (default {DEFAULT_SAMPLES})")
    p.add_argument("--calib-seq-len", type=int, default=DEFAULT_SEQ_LEN,
                   help=f"tokens per calibration row (default {DEFAULT_SEQ_LEN})")
    p.add_argument("--kv-cache", default=None, metavar="fp8",
                   help="fp8: also calibrate per-layer K and V scales (amax / 448, per tensor) in the same pass "
                   "and store the attention K/V cache in FP8 E4M3 (docs/quantization.md, 'FP8 K/V cache'); default: "
                   "the cache stays in the model dtype")
    p.add_argument("--quantize-lm-head", action="store_true",
                   help="fp8: quantize the vocabulary projection (lm_head) too, FP8 per output channel with a "
                   "static input scale, in ModelOpt's layout; a tied embedding keeps its 16-bit table for the "
                   "lookup and config.json unties them (default: lm_head stays 16-bit, as ModelOpt's presets)")
    add_device(p, "the calibration", "the gdn ops through the reference backend")
    add_overwrite(p, "the output folder")
    add_quiet(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    from gdn_export.hf_config import read_config
    from gdn_export.quantize import FORMATS
    from gdn_export.quantize.pipeline import quantize_checkpoint

    if args.format not in FORMATS:
        raise InputError(f"--format {args.format!r} is not one of {', '.join(FORMATS)}")
    from gdn_export.quantize.pipeline import KV_CACHE_FORMATS

    if args.kv_cache is not None and args.kv_cache not in KV_CACHE_FORMATS:
        raise InputError(f"--kv-cache {args.kv_cache!r} is not one of {', '.join(KV_CACHE_FORMATS)}")
    from gdn_export.quantize.pipeline import LM_HEAD_FORMATS

    if args.quantize_lm_head and args.format not in LM_HEAD_FORMATS:
        raise InputError(f"--quantize-lm-head applies to --format {' / '.join(LM_HEAD_FORMATS)}, not {args.format}")
    checkpoint = Path(args.checkpoint)
    checkpoint_dir(checkpoint)
    device = device_of(args)
    check_device(device)
    config = read_config(checkpoint / "config.json")  # a bad config.json is named before anything else
    if args.kv_cache is not None:
        from gdn_export.quantize.pipeline import check_kv_cache

        check_kv_cache(args.kv_cache, config)
    if args.calib_data is not None:
        from gdn_export.quantize.calib_data import check_calibration_file

        check_calibration_file(args.calib_data)
    output_dir(args.output, "-o", args)  # writable, and the overwrite policy, before calibration
    progress = Progress("quantize", args.quiet)
    path = quantize_checkpoint(checkpoint, args.output, args.format, calib_data=args.calib_data,
                               samples=args.calib_samples, seq_len=args.calib_seq_len,
                               overwrite=args.overwrite, progress=progress, device=device,
                               kv_cache=args.kv_cache, lm_head=args.quantize_lm_head)
    print(f"wrote {describe_folder(path)}")
    return 0
