"""The vision-language parts of `export`, `run`, `validate` and `build`: their flags and handlers
(docs/vision.md). The subcommands call in here through small hooks; the work
is gdn_export.vlm's (export, runner, validate)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gdn_export.cli.common import (TORCH_DTYPE_NAMES, Progress, device_of, dtype_of, output_file, parse_input_ids,
                                   parse_tolerances, save_logits, torch_dtype)
from gdn_export.errors import InputError

# ------------------------------------------------------------------------------------ export


def add_export_flags(p) -> None:
    p.add_argument("--text-only", action="store_true",
                   help="vision-language checkpoints: export the text graph alone, without visual "
                   "inputs and without the vision file (default: both files when the checkpoint "
                   "holds its vision tower)")


def export_vlm_if_composite(args, layout, progress) -> tuple | None:
    """Export both files when args.checkpoint holds a vision tower and --text-only is not given;
    returns the paths written, None when it did not (the text export follows)."""
    from gdn_export.vlm.export import export_vlm
    from gdn_export.vlm.weights import has_vision_tower, is_composite

    if not Path(args.checkpoint).is_dir() or not is_composite(args.checkpoint):
        return None
    if getattr(args, "text_only", False):
        progress("vision-language checkpoint, --text-only: exporting its language model alone")
        return None
    if not has_vision_tower(args.checkpoint):
        progress("vision-language config without vision tower weights (model.visual.*): exporting the "
                 "language model alone")
        return None
    return export_vlm(args.checkpoint, args.output, dtype=torch_dtype(args.dtype), layout=layout,
                      opset=args.opset, progress=progress, onnx_ops=args.onnx_ops, overwrite=args.overwrite,
                      whole_trace=getattr(args, "whole_trace", False))


# ------------------------------------------------------------------------------- run / validate


def add_image_flags(p) -> None:
    g = p.add_argument_group("images (vision-language models)")
    g.add_argument("--image", action="append", default=[], metavar="PATH",
                   help="an image for the first prompt row (repeat for several); read with Pillow, "
                   "resized and normalised by transformers' Qwen3.5 image processor; the runner puts "
                   "vision_start, the image's placeholder tokens and vision_end before the row's ids (default: none)")
    g.add_argument("--pixel-values", metavar="FILE.npz",
                   help="the image processor's output instead of --image: pixel_values + "
                   "image_grid_thw and / or pixel_values_videos + video_grid_thw (default: none)")


def wants_vlm(args) -> bool:
    from gdn_export.vlm.detect import is_vlm_engine, is_vlm_onnx

    return bool(args.image or args.pixel_values) or is_vlm_onnx(args.model) or is_vlm_engine(args.model)


class _VisionInfo:
    """What prompts and image processing need from a checkpoint: its vision config and processor
    settings (no weights)."""

    def __init__(self, config, processor_config):
        self.config, self.processor_config = config, processor_config


def _visual_inputs(args, vision):
    from gdn_export.vlm.images import VisualInputs, load_images, load_pixel_values

    if args.pixel_values:
        return load_pixel_values(args.pixel_values)
    if args.image:
        return load_images(args.image, vision.config, vision.processor_config)
    return VisualInputs()


def _precheck_visual_files(args) -> None:
    """Bad image / npz files are refused before any model loads."""
    from gdn_export.vlm.images import load_pixel_values, read_image

    if args.image and args.pixel_values:
        raise InputError("give --image or --pixel-values, not both")
    for path in args.image:
        read_image(path)
    if args.pixel_values:
        load_pixel_values(args.pixel_values)


def run_with_images(args) -> int:
    """`gdn-export run` for a vision-language model (images optional)."""
    from gdn_export.layout import DeployLayout
    from gdn_export.runtime.base import check_generation_fits
    from gdn_export.trt.build import ENGINE_SUFFIXES
    from gdn_export.vlm.runner import generate_vl, open_vlm, prompt_rows

    if args.max_new_tokens < 0:
        raise InputError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if not Path(args.model).exists():
        raise InputError(f"{args.model}: no such file or folder")
    is_engine = args.backend == "trt" or Path(args.model).suffix in ENGINE_SUFFIXES
    if args.prefill_chunk is not None:
        raise InputError("--prefill-chunk does not apply to prompts with images (prefilled in one call)")
    if args.op_backend not in (None, "reference"):
        raise InputError("--op-backend does not apply to vision-language runs")
    if args.plugins is not None and not is_engine:
        raise InputError(f"--plugins applies to the trt backend only; {args.model} is not an engine")
    ids = parse_input_ids(args.input_ids)
    if args.save_logits:
        output_file(args.save_logits, "--save-logits", args)
    _precheck_visual_files(args)
    is_dir = Path(args.model).is_dir()
    if not is_dir and (args.dtype or args.device):
        raise InputError(f"--dtype / --device apply to the torch backend only; {args.model} runs on "
                         f"{'trt' if is_engine else 'ort'}")
    progress = Progress("run", args.quiet)
    if is_dir:  # rows first (cheap: the config), then a cache just long enough for this generation
        from gdn_export.vlm.images import read_processor_config
        from gdn_export.vlm.weights import has_vision_tower, vision_config_of

        info = _VisionInfo(vision_config_of(args.model), read_processor_config(args.model))
        if not has_vision_tower(args.model):
            raise InputError(f"{args.model}: the checkpoint holds no vision tower (model.visual.*)")
        visual = _visual_inputs(args, info)
        rows = prompt_rows(ids, visual, info)
        layout = DeployLayout.make(cache_len=max(len(r) for r in rows) + max(args.max_new_tokens, 1))
        progress(f"loading {args.model}")
        runner, vision = open_vlm(args.model, device_of(args), dtype=torch_dtype(dtype_of(args)),
                                  layout=layout)
    else:
        progress(f"loading {args.model}")
        if is_engine:
            from gdn_export.vlm.trt_runner import open_trt_vlm

            runner, vision = open_trt_vlm(args.model, plugins=args.plugins)
        else:
            runner, vision = open_vlm(args.model)
        visual = _visual_inputs(args, vision)
        rows = prompt_rows(ids, visual, vision)
    check_generation_fits(runner.layout, rows, args.max_new_tokens)
    n_img = 0 if visual.image_grid_thw is None else len(visual.image_grid_thw)
    n_vid = 0 if visual.video_grid_thw is None else len(visual.video_grid_thw)
    progress(f"{runner.backend}: {n_img} images, {n_vid} videos; prefill {max(len(r) for r in rows)} tokens x "
             f"{len(rows)} rows, then greedy decoding of {args.max_new_tokens} new tokens")
    result = generate_vl(runner, vision, rows, visual, args.max_new_tokens)
    for row in result.rows():
        print(" ".join(str(int(t)) for t in row))
    if args.save_logits:
        save_logits(args, result, progress)
    return 0


def validate_with_images(args) -> int:
    """`gdn-export validate CHECKPOINT --onnx model.onnx` for a vision-language export: the vision
    features, the prefill logits (with images) and forced decode steps of PyTorch vs ONNX Runtime
    (gdn_export.vlm.validate), printed as the text validate's table with its tolerances and verdict.
    Without --image / --pixel-values, random pixels of two grids stand in for images."""
    from gdn_export.validate import format_table, write_json
    from gdn_export.validate.compare import default_tolerances
    from gdn_export.vlm.export import KEY_FINGERPRINT
    from gdn_export.vlm.runner import open_vlm, prompt_rows
    from gdn_export.vlm.validate import random_text_rows, random_visual_inputs, run_vl_parity
    from gdn_export.vlm.weights import fingerprint

    if args.engine:
        raise InputError("validate with images compares PyTorch and ONNX Runtime; drop --engine")
    if not args.onnx:
        raise InputError("validate with images needs --onnx (the vision-language model.onnx)")
    if args.json:
        output_file(args.json, "--json", args)
    if args.decode_steps < 0 or args.prompt_len < 1:
        raise InputError("--prompt-len must be >= 1 and --decode-steps >= 0")
    parse_tolerances(args.atol, args.rtol, 0.0, 0.0)  # their syntax; the defaults need the dtype
    _precheck_visual_files(args)
    if not Path(args.checkpoint).is_dir():
        raise InputError(f"{args.checkpoint}: checkpoint folder not found")
    from gdn_export.onnx.ort_native import check_file

    check_file(args.onnx)  # an ORT without the ort form's kernels: before any loading
    progress = Progress("validate", args.quiet)
    progress(f"loading {args.onnx} in ONNX Runtime")
    candidate, cand_vision = open_vlm(args.onnx)
    if candidate.metadata.get(KEY_FINGERPRINT) != fingerprint(args.checkpoint):
        raise InputError(f"--onnx {args.onnx} was exported from another checkpoint than {args.checkpoint}")
    exported = candidate.metadata.get("gdn_export.dtype")
    dtype = dtype_of(args, {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(exported))
    atol, rtol = default_tolerances(TORCH_DTYPE_NAMES[dtype], str(candidate.layout.state_dtype).removeprefix("torch."))
    tolerances = parse_tolerances(args.atol, args.rtol, atol, rtol)
    unknown = sorted(set(tolerances.per_tensor) - {"logits", "visual_embeds"})
    if unknown:
        raise InputError(f"--atol/--rtol {unknown[0]}: no such tensor; a vision-language validate compares "
                         f"logits and visual_embeds")
    progress(f"loading {args.checkpoint} in PyTorch ({dtype}, {device_of(args)})")
    reference, ref_vision = open_vlm(args.checkpoint, device_of(args), dtype=torch_dtype(dtype),
                                     layout=candidate.layout)
    rng = np.random.default_rng(args.seed)
    visual = _visual_inputs(args, ref_vision)
    if visual.empty:
        visual = random_visual_inputs(ref_vision.config, rng)
    ids = random_text_rows(ref_vision.config, reference.vocab_size, args.prompt_len, rng)
    report = run_vl_parity(reference, ref_vision, candidate, cand_vision, visual, prompt_rows(ids, visual, ref_vision),
                           decode_steps=args.decode_steps, tolerances=tolerances, seed=args.seed,
                           progress=progress)
    print(format_table(report))
    if args.json:
        write_json(report, args.json, overwrite=args.overwrite)
        progress(f"wrote {args.json}")
    return 0 if report.passed else 1
