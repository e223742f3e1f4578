"""`gdn-export export CHECKPOINT -o model.onnx`."""

from __future__ import annotations

from pathlib import Path

from gdn_export.cli.common import (checkpoint_dir, TORCH_DTYPE_NAMES, Progress, add_dtype, add_overwrite, add_quiet,
                                   dtype_of, output_file, torch_dtype)
from gdn_export.cli.vlm import add_export_flags, export_vlm_if_composite
from gdn_export.errors import InputError


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="export a checkpoint to ONNX with gdn custom nodes",
                       description="Export a Hugging Face checkpoint folder to one ONNX graph that "
                       "serves prefill and decode. The gated delta rule and the causal conv become "
                       "nodes of the 'gdn' domain that TensorRT maps to the gdn plugins.")
    p.add_argument("checkpoint", help="folder with config.json and *.safetensors")
    p.add_argument("-o", "--output", required=True, help="path of the .onnx file to write")
    add_dtype(p, "the exported graph")
    p.add_argument("--opset", type=int, default=None,
                   help="ONNX opset (default 24 for the inplace kv cache, 18 for concat)")
    from gdn_export.onnx.forms import FORMS

    p.add_argument("--onnx-ops", choices=FORMS, default="gdn",
                   help="gdn (default): GDN layers as gdn.GatedDeltaRule / gdn.CausalConv1d nodes (the "
                   "TensorRT plugins); standard: ONNX opset-27 LinearAttention / CausalConvWithState "
                   "with standard ops around them (docs/onnx.md, 'Standard ONNX ops'); ort: ONNX Runtime's com.microsoft GatedDeltaNet / "
                   "VarlenCausalConvWithState / GatedRMSNorm (onnxruntime >= 1.32 only; "
                   "docs/onnx_forms.md says which form for which runtime)")
    add_layout_flags(p)
    p.add_argument("--speculative", type=int, default=None, metavar="K",
                   help="also write the graphs of speculative decoding with the checkpoint's MTP head "
                   "beside the model: NAME.verify.onnx (K + 1 tokens a row, every GDN state kept) and "
                   "NAME.mtp.onnx (the head) (gdn_export.onnx.speculative; default: off)")
    p.add_argument("--whole-trace", action="store_true",
                   help="trace every decoder layer (the default traces one layer of each kind, or none "
                   "when the trace cache holds the architecture, and stamps it for every layer of its "
                   "kind: the same graph; docs/export-time.md)")
    add_overwrite(p, "the .onnx file (and its .data sidecar)")
    add_export_flags(p)
    add_quiet(p)
    p.set_defaults(handler=run)


def add_layout_flags(p) -> None:
    """The deployment-layout flags (gdn_export.layout), shared by export and bench."""
    g = p.add_argument_group("deployment layout")
    g.add_argument("--kv-cache", choices=("inplace", "concat"), default="inplace",
                   help="inplace (default): preallocated K/V cache updated in place (ONNX TensorScatter "
                   "+ Attention, opset 24); concat: K/V grow each step, for TensorRT < 10.15")
    g.add_argument("--max-cache-len", type=int, default=None,
                   help="K/V slots per attention layer of the inplace cache: the longest prompt plus "
                   "generation a row can hold (default 4096)")
    g.add_argument("--attention-sinks", type=int, default=0, metavar="S",
                   help="streaming: keep the first S tokens of every row (with --attention-window)")
    g.add_argument("--attention-window", type=int, default=0, metavar="W",
                   help="streaming: keep the last W tokens in a ring; the cache is S + W slots and "
                   "memory stays constant for unbounded streams")
    g.add_argument("--all-logits", action="store_true",
                   help="return logits [batch, seq, V] for every position (default: [batch, 1, V] at "
                   "each row's last token)")
    g.add_argument("--state-dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="storage dtype of the recurrent GDN state (math stays fp32)")


def layout_from_args(args):
    """The DeployLayout the layout flags ask for (GdnExportError naming a bad combination)."""
    from gdn_export.layout import DeployLayout

    if args.kv_cache == "concat" and args.max_cache_len is not None:
        raise InputError("--max-cache-len sizes the inplace K/V cache; --kv-cache concat grows its cache each step")
    return DeployLayout.make(kv_cache=args.kv_cache, cache_len=args.max_cache_len,
                             sinks=args.attention_sinks, window=args.attention_window,
                             logits="all" if args.all_logits else "last",
                             state_dtype=TORCH_DTYPE_NAMES[args.state_dtype])


def _sidecar(output) -> Path:
    from gdn_export.onnx.export import external_data_name

    return Path(output).parent / external_data_name(output)


def _export_bytes(checkpoint: str, dtype: str) -> int:
    """The weights' size in the exported dtype (what the .onnx, or its .data sidecar, holds), once
    the checkpoint's files, names, shapes and dtypes are checked (headers only)."""
    from gdn_export.weights.loader import check_checkpoint

    return check_checkpoint(checkpoint) * (4 if dtype == "fp32" else 2)


def run(args) -> int:
    from gdn_export.onnx.export import check_export_target, export_onnx
    from gdn_export.weights import load_checkpoint

    args.dtype = dtype_of(args)
    layout = layout_from_args(args)
    # export_onnx checks the target too, but only after the (possibly minutes long) checkpoint load.
    output = output_file(args.output, "-o", args, suffix=".onnx", also=(_sidecar(args.output),))
    check_export_target(output, args.opset, layout)
    checkpoint_dir(args.checkpoint)
    extra = _check_speculative(args, layout, output) if args.speculative is not None else ()
    _check_quantized_opset(Path(args.checkpoint), args.opset, layout)
    output_file(output, "-o", args, also=(_sidecar(output),),
                need_bytes=_export_bytes(args.checkpoint, args.dtype))
    _check_trace_memory(Path(args.checkpoint), layout, args.dtype)
    progress = Progress("export", args.quiet)
    paths = export_vlm_if_composite(args, layout, progress)  # model.onnx + model.vision.onnx
    if paths:
        for path in paths:
            print(f"wrote {path}")
        return 0
    progress(f"loading {args.checkpoint} as {args.dtype}")
    model = load_checkpoint(args.checkpoint, dtype=torch_dtype(args.dtype))
    model.layout = layout
    path = export_onnx(model, args.output, opset=args.opset, progress=progress, onnx_ops=args.onnx_ops,
                       overwrite=args.overwrite, whole_trace=args.whole_trace)
    for written in _export_speculative(args, model, path, extra, progress) if extra else [path]:
        print(f"wrote {written}")
    return 0


def _export_speculative(args, model, path: Path, extra: tuple[Path, Path], progress) -> list[Path]:
    """The verify form and the MTP head beside `path` (the model's graph); returns the three paths.
    Where either fails, the files this command wrote (the model's graph included) are removed
    before the error goes on."""
    from gdn_export.onnx.speculative import export_mtp, export_verify
    from gdn_export.weights.mtp import load_mtp

    written = [path]
    try:
        mtp = load_mtp(args.checkpoint, model)
        written.append(export_verify(model, extra[0], args.speculative, opset=args.opset, progress=progress,
                                     overwrite=args.overwrite))
        written.append(export_mtp(mtp, extra[1], opset=args.opset, progress=progress, overwrite=args.overwrite))
    except BaseException:
        for done in written:
            Path(done).unlink(missing_ok=True)
            _sidecar(done).unlink(missing_ok=True)
        raise
    return written


def _check_speculative(args, layout, output) -> tuple[Path, Path]:
    """--speculative K: its two files may be written, and the checkpoint and layout take it."""
    from gdn_export.hf_config import read_config
    from gdn_export.models.verify import check_layout
    from gdn_export.onnx.speculative import speculative_paths
    from gdn_export.weights.mtp import check_has_mtp

    if not 1 <= args.speculative <= 16:
        raise InputError(f"--speculative must be in [1, 16], got {args.speculative}")
    if args.onnx_ops != "gdn":
        raise InputError("--speculative writes gdn nodes; drop --onnx-ops standard")
    check_layout(layout)
    config = read_config(Path(args.checkpoint) / "config.json")
    check_has_mtp(config, args.checkpoint)
    from gdn_export.vlm.weights import has_vision_tower

    if not getattr(args, "text_only", False) and has_vision_tower(args.checkpoint):
        raise InputError("--speculative writes the text model's graphs; add --text-only for a checkpoint "
                         "with a vision tower")
    if _check_quantized(Path(args.checkpoint)):
        raise InputError("--speculative: the speculative graphs are written for 16-bit checkpoints")
    paths = speculative_paths(output)
    for path in paths:
        output_file(path, "-o", args, suffix=".onnx")
    return paths


def _check_quantized(checkpoint: Path) -> bool:
    from gdn_export.weights.quantized import read_quant_config

    return read_quant_config(checkpoint / "config.json") is not None


def _check_trace_memory(checkpoint: Path, layout, dtype: str) -> None:
    """A cache length whose example K/V cache (what the trace holds) does not fit in memory is named
    before the load."""
    from gdn_export.hf_config import read_config
    from gdn_export.onnx.export import EXAMPLE_BATCH, trace_cache_bytes
    from gdn_export.runtime.memory import check_host_bytes
    config = read_config(checkpoint / "config.json")
    check_host_bytes(trace_cache_bytes(config, layout, 4 if dtype == "fp32" else 2),
                     f"--max-cache-len {layout.cache_len}: tracing the export holds an example K/V cache "
                     f"(batch {EXAMPLE_BATCH}, inputs and outputs) whose tensors", "give a shorter cache")


def _check_quantized_opset(checkpoint: Path, opset, layout) -> None:
    """A quantized checkpoint needs opset >= 21 (FLOAT8 / INT4 Q/DQ): said before the load."""
    from gdn_export.onnx.export import default_opset
    from gdn_export.ops.quant_linear.onnx import MIN_OPSET
    from gdn_export.weights.quantized import read_quant_config

    opset = default_opset(layout) if opset is None else opset
    qc = read_quant_config(checkpoint / "config.json")
    if qc is not None and opset < MIN_OPSET:
        raise InputError(f"{checkpoint} is quantized (quant_method {qc.get('quant_method')!r}): its FLOAT8 / INT4 "
                         f"Q/DQ need opset >= {MIN_OPSET}, not {opset} (use the inplace kv cache or --opset 21)")
