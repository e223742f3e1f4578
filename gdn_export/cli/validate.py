"""`gdn-export validate CHECKPOINT --onnx model.onnx [--engine model.engine]`: the parity report."""

from __future__ import annotations


from gdn_export.cli.common import (checkpoint_dir, input_file, TORCH_DTYPE_NAMES, Progress, add_device, add_dtype,
                                   add_overwrite, add_plugins, device_of, dtype_of,
                                   add_quiet, add_seed, add_tolerances, output_file, parse_tolerances)
from gdn_export.cli.runners import add_ort_kernels, check_device, open_runner
from gdn_export.cli.vlm import add_image_flags, validate_with_images
from gdn_export.errors import InputError

_FLAGS = {"batch": "--batch", "prompt_len": "--prompt-len", "decode_steps": "--decode-steps"}


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="compare PyTorch with ONNX Runtime / TensorRT",
                       description="Run the PyTorch model and each other backend on the same random "
                       "prompts (prefill, then forced decode steps), print max abs / rel error of "
                       "the logits and of every state, and exit 1 when any is over tolerance. A graph of "
                       "`export --speculative` (NAME.verify.onnx, NAME.mtp.onnx) is checked against the "
                       "checkpoint's verify form or MTP head on ragged random inputs instead.")
    p.add_argument("checkpoint", help="folder with config.json and *.safetensors (the reference)")
    p.add_argument("--onnx", help="exported model to run in ONNX Runtime (default: none; give --onnx and/or --engine)")
    p.add_argument("--engine", help="TensorRT engine to run (needs TensorRT and a supported GPU; default: none)")
    add_plugins(p, "--engine")
    g = p.add_argument_group("PyTorch reference")
    add_dtype(g, "the PyTorch reference")
    add_device(g, "the PyTorch reference")
    p.add_argument("--ort-device", default="cpu",
                   help="device of ONNX Runtime for --onnx: cpu or cuda[:N] (onnxruntime-gpu)")
    add_ort_kernels(p)
    p.add_argument("--batch", type=int, default=2, help="prompt rows")
    p.add_argument("--prompt-len", type=int, default=37, help="tokens of the longest prompt")
    p.add_argument("--decode-steps", type=int, default=4,
                   help="forced decode steps after the prefill (well past the window to check "
                   "streaming)")
    add_seed(p, "the random prompts")
    p.add_argument("--equal-lengths", action="store_true",
                   help="give every row --prompt-len tokens (default with the inplace kv cache: "
                   "ragged rows from --prompt-len down to 1 token)")
    g = p.add_argument_group("quantized checkpoints: their distance from the 16-bit model")
    g.add_argument("--baseline", metavar="CHECKPOINT", default=None,
                   help="the 16-bit checkpoint it was quantized from (default: its own weights dequantized to "
                   "16 bits)")
    g.add_argument("--quant-tol", type=float, default=None, metavar="REL_RMS",
                   help="the largest logits relative RMS accepted (default: per format, fp8 0.6, int4-awq 1.5: "
                   "gdn_export.quantize.report.DISTANCE_BOUNDS)")
    p.add_argument("--json", metavar="REPORT.json", help="also write the report as JSON (default: not written)")
    p.add_argument("--logits-only", action="store_true", help="print only the logits rows")
    add_overwrite(p, "the --json file")
    add_tolerances(p)
    add_image_flags(p)
    add_quiet(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    from gdn_export.validate import check_parity_sizes, format_table, run_parity, write_json
    from gdn_export.validate.compare import default_tolerances

    if not (args.onnx or args.engine):
        raise InputError("nothing to validate: give --onnx and/or --engine")
    from gdn_export.onnx.metadata import KEY_SPECULATIVE_ROLE
    from gdn_export.trt.build import record_metadata
    from gdn_export.validate.speculative import speculative_role

    engine_role = record_metadata(args.engine).get(KEY_SPECULATIVE_ROLE) if args.engine else None
    if engine_role:
        raise InputError(f"--engine {args.engine}: an engine of a speculative graph ({engine_role}); "
                         f"validate its ONNX file with --onnx (the TensorRT runner runs the model's graph only)")
    role = speculative_role(args.onnx) if args.onnx else None
    if role:
        return _validate_speculative(args, role)
    from gdn_export.vlm.detect import is_vlm_onnx

    if args.image or args.pixel_values or (args.onnx and is_vlm_onnx(args.onnx)):
        return validate_with_images(args)
    # run_parity and write_json check these too, but only after the (slow) model loads.
    check_parity_sizes(args.batch, args.prompt_len, args.decode_steps, spelling=_FLAGS)
    from gdn_export.runtime.memory import check_host_bytes

    ids = f"--batch {args.batch} x --prompt-len {args.prompt_len} token ids"
    check_host_bytes(8 * args.batch * args.prompt_len, ids, "lower --batch or --prompt-len")
    if args.json:
        output_file(args.json, "--json", args)
    check_device(device_of(args))
    for flag, path in (("--onnx", args.onnx), ("--engine", args.engine)):
        if path:
            input_file(path, "ONNX file" if flag == "--onnx" else "engine file")
    checkpoint_dir(args.checkpoint)
    if args.quant_tol is not None:
        if not args.quant_tol >= 0:  # NaN too
            raise InputError(f"--quant-tol must be a number >= 0, got {args.quant_tol}")
        _check_quantized(args.checkpoint, "--quant-tol")
    if args.baseline is not None:
        checkpoint_dir(args.baseline)
        _check_baseline(args.checkpoint, args.baseline)
    from gdn_export.weights.loader import check_checkpoint

    check_checkpoint(args.checkpoint)  # files, names, shapes, dtypes: before the first progress line
    parse_tolerances(args.atol, args.rtol, 0.0, 0.0)  # their syntax; the defaults need the dtype
    if args.onnx:  # onnxruntime-gpu / a GPU missing, an ORT without the ort form's kernels: before any loading
        from gdn_export.onnx.ort_native import check_file
        from gdn_export.runtime import ort_device

        providers = ort_device.providers_for(ort_device.parse_device(args.ort_device, "--ort-device"), "--ort-device")
        check_file(args.onnx, args.ort_kernels, providers)
    if args.onnx:
        _check_cache(_onnx_layout(args.onnx), args, args.onnx)
    if args.engine:  # the plugin library: found and loadable before the first progress line
        from gdn_export.trt import loader

        loader.check_loads(loader.find_plugins(args.plugins))
    progress = Progress("validate", args.quiet)
    candidates = {}  # what the user gave -> runner
    if args.onnx:
        progress(f"loading {args.onnx} in ONNX Runtime")
        ort_runner = open_runner(args.onnx, "ort", device=args.ort_device, ort_kernels=args.ort_kernels)
        progress(f"ort on {ort_runner.device}: {ort_runner.kernels_note}")
        candidates[f"--onnx {args.onnx}"] = ort_runner
    if args.engine:
        progress(f"loading {args.engine} in TensorRT")
        candidates[f"--engine {args.engine}"] = open_runner(args.engine, "trt", plugins=args.plugins)
    first = next(iter(candidates.values()))
    _check_fits(first, args)
    dtype = dtype_of(args, _dtype_of(first))
    state_dtype = str(first.layout.state_dtype).removeprefix("torch.")
    atol, rtol = default_tolerances(TORCH_DTYPE_NAMES[dtype], state_dtype)
    from gdn_export.quantize.report import STEP_NOTE, rounding_step

    tolerances = parse_tolerances(args.atol, args.rtol, atol, rtol)
    if not (args.atol or args.rtol):  # tolerances the user gave are held exactly
        tolerances.step, tolerances.step_note = rounding_step(first), STEP_NOTE  # static FP8 activations only
    from gdn_export.validate.kv_fp8 import raise_cache_tolerances

    raise_cache_tolerances(candidates.values(), tolerances)  # FP8 K/V caches: atol / scale, one e4m3 code
    _check_tensor_names(tolerances, first)
    progress(f"loading {args.checkpoint} in PyTorch ({dtype}, {device_of(args)})")
    reference = open_runner(args.checkpoint, "torch", dtype=dtype, device=device_of(args), layout=first.layout)
    for what, runner in candidates.items():
        _check_same_model(reference, runner, what)
    from gdn_export.quantize.report import match_graph_form, quantization_distance

    match_graph_form(reference.model, progress)
    report = run_parity(reference, list(candidates.values()), vocab_size=reference.vocab_size, tolerances=tolerances,
                        batch=args.batch, prompt_len=args.prompt_len,
                        decode_steps=args.decode_steps, seed=args.seed,
                        ragged=False if args.equal_lengths else None, progress=progress)
    print(format_table(report, states=not args.logits_only))
    for runner in candidates.values():  # ONNX Runtime's warnings of the whole run, one line
        summary = getattr(runner, "ort_log", None) and runner.ort_log.summary()
        if summary:
            progress(summary)
    distance = quantization_distance(reference.model, args.seed, progress, baseline=args.baseline,
                                     bound=args.quant_tol)
    if distance:
        print(distance.line())
    if args.json:
        write_json(report, args.json, overwrite=args.overwrite)
        progress(f"wrote {args.json}")
    return 0 if report.passed and (distance is None or distance.passed) else 1


def _validate_speculative(args, role: str) -> int:
    """--onnx NAME.verify.onnx / NAME.mtp.onnx (gdn_export.validate.speculative)."""
    from gdn_export.validate.speculative import format_rows, validate_speculative

    if args.engine:
        raise InputError(f"--onnx {args.onnx} is the {role} graph of `export --speculative`; validate it alone "
                         f"(no --engine)")
    for flag, given in (("--image", args.image), ("--pixel-values", args.pixel_values),
                        ("--baseline", args.baseline), ("--quant-tol", args.quant_tol is not None),
                        ("--atol", args.atol)):
        if given:
            raise InputError(f"{flag} does not apply to the {role} graph of `export --speculative`")
    if args.ort_device != "cpu":
        raise InputError(f"the {role} graph is validated in ONNX Runtime on the CPU, not --ort-device {args.ort_device}")
    from gdn_export.validate import check_parity_sizes

    check_parity_sizes(args.batch, args.prompt_len, args.decode_steps, spelling=_FLAGS)
    if args.json:
        output_file(args.json, "--json", args)
    input_file(args.onnx, "ONNX file")
    checkpoint_dir(args.checkpoint)
    from gdn_export.weights.loader import check_checkpoint

    check_checkpoint(args.checkpoint)
    tol = parse_tolerances([], args.rtol, 0.0, None)
    bounds = {name: r for name, (_, r) in tol.per_tensor.items()}
    rows = validate_speculative(args.onnx, args.checkpoint, args.batch, args.prompt_len, args.seed,
                                bounds=bounds, default_bound=tol.rtol, progress=Progress("validate", args.quiet))
    print(format_rows(rows))
    if args.json:
        import json

        from gdn_export.paths import atomic_file

        with atomic_file(args.json, f"JSON report {args.json}", overwrite=args.overwrite) as tmp:
            tmp.write_text(json.dumps({"graph": str(args.onnx), "role": role, "passed": all(r.ok for r in rows),
                                       "rows": [{"call": r.call, "output": r.output, "error": r.error,
                                                 "bound": r.bound, "ok": r.ok} for r in rows]}, indent=2))
    return 0 if all(r.ok for r in rows) else 1


def _check_quantized(checkpoint: str, flag: str) -> None:
    from pathlib import Path

    from gdn_export.weights.quantized import read_quant_config

    if read_quant_config(Path(checkpoint) / "config.json") is None:
        raise InputError(f"{flag} applies to a quantized checkpoint; {checkpoint} is not quantized "
                         f"(no quantization_config)")


def _check_baseline(checkpoint: str, baseline: str) -> None:
    """--baseline names the 16-bit source of a quantized checkpoint: the checkpoint must be quantized
    and the baseline the same model (every config field but the dtype, and tie_word_embeddings, which a
    quantized lm_head unties: `quantize --quantize-lm-head`)."""
    from pathlib import Path

    from gdn_export.hf_config import read_config

    _check_quantized(checkpoint, "--baseline")
    mine = read_config(Path(checkpoint) / "config.json").to_dict()
    theirs = read_config(Path(baseline) / "config.json").to_dict()
    differ = [k for k in mine if k not in ("dtype", "tie_word_embeddings") and mine[k] != theirs.get(k)]
    if differ:
        raise InputError(f"--baseline {baseline} is not the model {checkpoint} was quantized from: {differ[0]} is "
                         f"{theirs.get(differ[0])!r} there, {mine[differ[0]]!r} here")


def _onnx_layout(path: str):
    """The DeployLayout recorded in an ONNX file's metadata, None when it cannot be read (the
    ONNX Runtime runner then names the problem)."""
    try:
        import onnx

        from gdn_export.onnx.metadata import read_layout

        model = onnx.load(path, load_external_data=False)
        return read_layout({p.key: p.value for p in model.metadata_props})
    except Exception:  # noqa: BLE001 - reported by the runner
        return None


def _check_cache(layout, args, what: str) -> None:
    """The prompt and every decode step in the file's K/V cache (each runner would say so only at
    the step that overflows)."""
    need = args.prompt_len + args.decode_steps
    if layout is not None and layout.inplace and not layout.streaming and need > layout.cache_len:
        raise InputError(f"--prompt-len {args.prompt_len} + --decode-steps {args.decode_steps} = {need} tokens "
                         f"exceed the cache of {layout.cache_len} slots of {what} "
                         f"(export with --max-cache-len {need})")


def _check_fits(runner, args) -> None:
    """The K/V cache (an engine's, read once loaded), and the states and logits in memory, before
    the first forward."""
    from gdn_export.runtime.memory import check_generation_memory

    _check_cache(runner.layout, args, args.onnx or args.engine)
    rows = [range(args.prompt_len)] * args.batch  # lengths only: no ids are made for the check
    check_generation_memory(runner, rows, args.decode_steps + 1, hint="lower --batch, --prompt-len or --decode-steps")


def _dtype_of(runner) -> str | None:
    """The model precision (fp32 / fp16 / bf16) of an exported runner, if it can tell."""
    from gdn_export.onnx.metadata import KEY_DTYPE

    name = getattr(runner, "metadata", {}).get(KEY_DTYPE)
    if name is None:
        # conv and key / value states are kept in the model's dtype (recurrent states in fp32).
        name = next((s.dtype for s in runner.state_specs if s.kind != "recurrent"), None)
    return {v: k for k, v in TORCH_DTYPE_NAMES.items()}.get(name)


def _check_tensor_names(tolerances, runner) -> None:
    """A per-tensor override whose name matches no row would be ignored without a word."""
    known = {"logits", *(s.name for s in runner.state_specs)}
    for name in tolerances.per_tensor:
        if name not in known:
            raise InputError(f"--atol/--rtol {name}: no such tensor; use logits or a state name "
                             f"such as {runner.state_specs[0].name} (past.LAYER.KIND)")


def _check_same_model(reference, runner, what: str) -> None:
    """A file exported from another checkpoint would end in "missing" rows (other layers) or in an
    out-of-range token id (smaller vocab) inside run_parity, after the slow part; say what differs
    instead, before it. Dtypes may differ on purpose (an fp16 export against an fp32 reference
    with --dtype fp32)."""
    from gdn_export.onnx.metadata import KEY_FAMILY

    hint = "; was it exported from this checkpoint?"
    family, want_family = getattr(runner, "metadata", {}).get(KEY_FAMILY), reference.model.config.family
    if family is not None and family != want_family:
        raise InputError(f"{what} is a {family} model, the checkpoint {want_family}{hint}")
    if runner.vocab_size != reference.vocab_size:
        raise InputError(f"{what} has vocab size {runner.vocab_size}, the checkpoint "
                         f"{reference.vocab_size}{hint}")
    want = {s.name: s.shape for s in reference.state_specs}
    got = {s.name: s.shape for s in runner.state_specs}
    for name in want:
        if name not in got:
            raise InputError(f"{what} has no state {name}, which the checkpoint's model has{hint}")
        if got[name] != want[name]:
            raise InputError(f"state {name} is {list(got[name])} in {what}, {list(want[name])} in the "
                             f"checkpoint's model{hint}")
    extra = sorted(got.keys() - want.keys())
    if extra:
        raise InputError(f"{what} has a state {extra[0]} that the checkpoint's model lacks{hint}")
