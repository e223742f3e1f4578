"""The vision-language parts of `export`, `run`, `validate` and `build` (flags and handlers);
the subcommands call in here through small hooks (README: "Vision-language checkpoints")."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from gdn_export.errors import InputError


# ------------------------------------------------------------------------------------ export


def add_export_flags(p) -> None:
    p.add_argument("--text-only", action="store_true",
                   help="vision-language checkpoints: export the text graph alone, without visual "
                   "inputs and without the vision file (default: both files when the checkpoint "
                   "holds its vision tower)")


def export_vlm_if_composite(args, layout, progress) -> bool:
    """Export both files when args.checkpoint holds a vision tower and --text-only is not given;
    returns whether it did."""
    from gdn_export.cli.common import torch_dtype
    from gdn_export.vlm.export import export_vlm
    from gdn_export.vlm.weights import has_vision_tower

    if getattr(args, "text_only", False) or not Path(args.checkpoint).is_dir() \
            or not has_vision_tower(args.checkpoint):
        return False
    paths = export_vlm(args.checkpoint, args.output, dtype=torch_dtype(args.dtype), layout=layout,
                       opset=args.opset, progress=progress, onnx_ops=args.onnx_ops)
    for path in paths:
        print(f"wrote {path}")
    return True


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


def _is_file(path: Path) -> bool:
    """Path.is_file, False where the path cannot be looked at (the text runner names the reason)."""
    try:
        return path.is_file()
    except OSError:
        return False


def is_vlm_onnx(path) -> bool:
    """Whether `path` is the language graph of a vision-language export."""
    from gdn_export.vlm.export import KEY_ROLE

    path = Path(path)
    if path.suffix != ".onnx" or not _is_file(path):
        return False
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # not ONNX: the text runner reports it
        return False
    return any(p.key == KEY_ROLE and p.value == "language" for p in model.metadata_props)


def is_vlm_engine(path) -> bool:
    """Whether `path` is a language engine built from a vision-language export (its build record
    keeps the ONNX metadata)."""
    from gdn_export.vlm.export import KEY_ROLE

    path = Path(path)
    if path.suffix not in (".engine", ".plan", ".trt") or not _is_file(path):
        return False
    from gdn_export.trt.build import layers_path

    try:
        record = json.loads(layers_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return record.get("metadata", {}).get(KEY_ROLE) == "language"


def wants_vlm(args) -> bool:
    return bool(args.image or args.pixel_values) or is_vlm_onnx(args.model) or is_vlm_engine(args.model)


class _VisionInfo:
    """What prompts and image processing need from a checkpoint: its vision config and processor
    settings (no weights)."""

    def __init__(self, config, processor_config):
        self.config, self.processor_config = config, processor_config


def _visual_inputs(args, vision):
    from gdn_export.vlm.images import load_images, load_pixel_values
    from gdn_export.vlm.runner import VisualInputs

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


def _prompt_rows(ids, visual, vision):
    from gdn_export.vlm.positions import build_prompt
    from gdn_export.vlm.runner import tokens_of

    rows = [np.asarray(r, np.int64) for r in ids]
    if not visual.empty:
        images = visual.image_grid_thw if visual.image_grid_thw is not None else []
        videos = visual.video_grid_thw if visual.video_grid_thw is not None else []
        rows[0] = build_prompt(rows[0], images, videos, tokens_of(vision))
    return rows


def _grid_tokens(visual, vision) -> int:
    from gdn_export.vlm.runner import tokens_of

    tokens = tokens_of(vision)
    grids = [*(visual.image_grid_thw if visual.image_grid_thw is not None else []),
             *(visual.video_grid_thw if visual.video_grid_thw is not None else [])]
    return sum(tokens.merged(g) + 2 * int(g[0]) for g in grids)


def run_with_images(args) -> int:
    """`gdn-export run` for a vision-language model (images optional)."""
    from gdn_export.cli.common import Progress, check_output_file, parse_input_ids
    from gdn_export.layout import DeployLayout
    from gdn_export.runtime.base import check_generation_fits
    from gdn_export.vlm.runner import generate_vl, open_vlm

    if args.max_new_tokens < 0:
        raise InputError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if not Path(args.model).exists():
        raise InputError(f"{args.model}: no such file or folder")
    is_engine = args.backend == "trt" or Path(args.model).suffix in (".engine", ".plan", ".trt")
    if args.prefill_chunk is not None:
        raise InputError("--prefill-chunk does not apply to prompts with images (prefilled in one call)")
    if args.op_backend not in (None, "reference"):
        raise InputError("--op-backend does not apply to vision-language runs")
    if args.plugins is not None and not is_engine:
        raise InputError(f"--plugins applies to the trt backend only; {args.model} is not an engine")
    ids = parse_input_ids(args.input_ids)
    if args.save_logits:
        check_output_file(args.save_logits, "--save-logits")
    _precheck_visual_files(args)
    is_dir = Path(args.model).is_dir()
    if not is_dir and (args.dtype or args.device):
        raise InputError(f"--dtype / --device apply to the torch backend only; {args.model} runs on ort")
    progress = Progress("run", args.quiet)
    from gdn_export.cli.common import torch_dtype

    if is_dir:  # rows first (cheap: the config), then a cache just long enough for this generation
        from gdn_export.vlm.images import read_processor_config
        from gdn_export.vlm.weights import has_vision_tower, vision_config_of

        info = _VisionInfo(vision_config_of(args.model), read_processor_config(args.model))
        if not has_vision_tower(args.model):
            raise InputError(f"{args.model}: the checkpoint holds no vision tower (model.visual.*)")
        visual = _visual_inputs(args, info)
        rows = _prompt_rows(ids, visual, info)
        layout = DeployLayout.make(cache_len=max(len(r) for r in rows) + max(args.max_new_tokens, 1))
        progress(f"loading {args.model}")
        runner, vision = open_vlm(args.model, args.device or "cpu", dtype=torch_dtype(args.dtype or "fp32"),
                                  layout=layout)
    else:
        progress(f"loading {args.model}")
        if is_engine:
            from gdn_export.vlm.trt_runner import open_trt_vlm

            runner, vision = open_trt_vlm(args.model, plugins=args.plugins)
        else:
            runner, vision = open_vlm(args.model)
        visual = _visual_inputs(args, vision)
        rows = _prompt_rows(ids, visual, vision)
    check_generation_fits(runner.layout, rows, args.max_new_tokens)
    n_img = 0 if visual.image_grid_thw is None else len(visual.image_grid_thw)
    n_vid = 0 if visual.video_grid_thw is None else len(visual.video_grid_thw)
    progress(f"{runner.backend}: {n_img} images, {n_vid} videos; prefill {max(len(r) for r in rows)} tokens x "
             f"{len(rows)} rows, then greedy decoding of {args.max_new_tokens} new tokens")
    result = generate_vl(runner, vision, rows, visual, args.max_new_tokens)
    for row in result.rows():
        print(" ".join(str(int(t)) for t in row))
    if args.save_logits:
        _save_npz(args.save_logits, generated=result.generated, prompt_lengths=result.prompt_lengths,
                  **{f"step_{i}": lg for i, lg in enumerate(result.step_logits)})
        progress(f"saved {len(result.step_logits)} steps of logits to {args.save_logits}")
    return 0


def _save_npz(path, **arrays) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".npz", dir=path.parent or ".")
    os.close(fd)
    try:
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def validate_with_images(args) -> int:
    """`gdn-export validate CHECKPOINT --onnx model.onnx` for a vision-language export: the vision
    features, the prefill logits (with images) and forced decode steps of PyTorch vs ONNX Runtime.
    Without --image / --pixel-values, random pixels of two grids stand in for images."""
    from gdn_export.cli.common import TORCH_DTYPE_NAMES, Progress, check_output_file, parse_tolerances
    from gdn_export.layout import DeployLayout
    from gdn_export.validate.compare import default_tolerances
    from gdn_export.vlm.runner import VisualInputs, open_vlm

    if args.engine:
        raise InputError("validate with images compares PyTorch and ONNX Runtime; drop --engine")
    if not args.onnx:
        raise InputError("validate with images needs --onnx (the vision-language model.onnx)")
    if args.json:
        check_output_file(args.json, "--json")
    if args.decode_steps < 0 or args.prompt_len < 1:
        raise InputError("--prompt-len must be >= 1 and --decode-steps >= 0")
    _precheck_visual_files(args)
    from gdn_export.onnx.ort_native import check_file

    check_file(args.onnx)  # an ORT without the ort form's kernels: before any loading
    progress = Progress("validate", args.quiet)
    progress(f"loading {args.onnx} in ONNX Runtime")
    candidate, cand_vision = open_vlm(args.onnx)
    exported = candidate.metadata.get("gdn_export.dtype")
    dtype = args.dtype or {"float16": "fp16", "bfloat16": "bf16"}.get(exported, "fp32")
    atol, rtol = default_tolerances(TORCH_DTYPE_NAMES[dtype], str(candidate.layout.state_dtype).removeprefix("torch."))
    tol = parse_tolerances(args.atol, args.rtol, atol, rtol)
    from gdn_export.cli.common import torch_dtype
    from gdn_export.vlm.export import KEY_FINGERPRINT
    from gdn_export.vlm.weights import fingerprint

    if not Path(args.checkpoint).is_dir():
        raise InputError(f"{args.checkpoint}: checkpoint folder not found")
    if candidate.metadata.get(KEY_FINGERPRINT) != fingerprint(args.checkpoint):
        raise InputError(f"--onnx {args.onnx} was exported from another checkpoint than {args.checkpoint}")
    progress(f"loading {args.checkpoint} in PyTorch ({dtype}, {args.device})")
    reference, ref_vision = open_vlm(args.checkpoint, args.device, dtype=torch_dtype(dtype),
                                     layout=candidate.layout)
    visual = _visual_inputs(args, ref_vision)
    rng = np.random.default_rng(args.seed)
    if visual.empty:
        c, m = ref_vision.config, ref_vision.config.spatial_merge_size
        grids = np.array([[1, 2 * m, 3 * m], [1, m, m]], np.int64)
        visual = VisualInputs(rng.standard_normal((int(grids.prod(-1).sum()), c.patch_dim)).astype(np.float32), grids)
    vocab = reference.vocab_size
    special = {ref_vision.config.image_token_id, ref_vision.config.video_token_id}
    ids = [rng.integers(0, vocab, args.prompt_len), rng.integers(0, vocab, max(1, args.prompt_len // 2))]
    ids = [np.where(np.isin(r, list(special)), 0, r) for r in ids]  # no stray placeholders
    rows = _prompt_rows(ids, visual, ref_vision)
    report = []
    progress("vision encoders")
    ref_feats = _encode(ref_vision, visual)
    cand_feats = _encode(cand_vision, visual)
    report.append(_row("visual_embeds", cand_feats, ref_feats, tol))
    progress(f"prefill {max(len(r) for r in rows)} tokens x {len(rows)} rows, {args.decode_steps} decode steps")
    ref_logits, picks = _forced(reference, ref_vision, rows, visual, args.decode_steps, None)
    cand_logits, _ = _forced(candidate, cand_vision, rows, visual, args.decode_steps, picks)
    for i, (a, b) in enumerate(zip(cand_logits, ref_logits)):
        report.append(_row("logits prefill" if i == 0 else f"logits step {i}", a, b, tol))
    print(f"{'tensor':<16} {'max abs':>10} {'max rel':>10}  ok")
    for r in report:
        print(f"{r['tensor']:<16} {r['max_abs']:>10.3g} {r['max_rel']:>10.3g}  {'yes' if r['passed'] else 'NO'}")
    passed = all(r["passed"] for r in report)
    if args.json:
        path = Path(args.json)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({"passed": passed, "atol": tol.atol, "rtol": tol.rtol, "rows": report},
                                  indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    return 0 if passed else 1


def _encode(vision, visual):
    from gdn_export.vlm.runner import encode_all

    return encode_all(vision, visual)


def _forced(runner, vision, rows, visual, steps, picks):
    """Prefill with images, then `steps` decode calls feeding `picks` [B, steps] (None: this
    runner's greedy picks). Returns ([prefill [B, V], step [B, V] ...], picks)."""
    from gdn_export.vlm.runner import prefill_vl

    logits, states, lens = prefill_vl(runner, vision, rows, visual)
    out, own, past = [logits], [], lens.copy()
    for s in range(steps):
        token = picks[:, s:s + 1] if picks is not None else out[-1].argmax(-1)[:, None].astype(np.int64)
        own.append(token)
        logits, states = runner.forward(token, past, states)
        out.append(logits[:, -1])
        past += 1
    return out, (np.concatenate(own, 1) if own else np.zeros((len(rows), 0), np.int64))


def _row(name, actual, expected, tol) -> dict:
    diff = np.abs(np.asarray(actual, np.float64) - np.asarray(expected, np.float64))
    rel = diff / np.maximum(np.abs(expected), 1e-30)
    passed = bool(np.isfinite(actual).all() and (diff <= tol.atol + tol.rtol * np.abs(expected)).all())
    return {"tensor": name, "max_abs": float(diff.max()) if diff.size else 0.0,
            "max_rel": float(rel.max()) if rel.size else 0.0, "passed": passed}
