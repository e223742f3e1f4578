"""`gdn-export export CHECKPOINT -o model.onnx`."""

from __future__ import annotations

from pathlib import Path

from gdn_export.cli.common import DTYPES, Progress, add_quiet, torch_dtype
from gdn_export.errors import InputError


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="export a checkpoint to ONNX with gdn custom nodes",
                       description="Export a Hugging Face checkpoint folder to one ONNX graph that "
                       "serves prefill and decode. The gated delta rule and the causal conv become "
                       "nodes of the 'gdn' domain that TensorRT maps to the gdn plugins.")
    p.add_argument("checkpoint", help="folder with config.json and *.safetensors")
    p.add_argument("-o", "--output", required=True, help="path of the .onnx file to write")
    p.add_argument("--dtype", choices=DTYPES, default="fp32", help="precision of the exported graph")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset (default: the exporter's)")
    add_quiet(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    from gdn_export.onnx.export import ONNX_OPSET, check_export_target, export_onnx
    from gdn_export.weights import load_checkpoint

    # export_onnx checks the target too, but only after the (possibly minutes long) checkpoint load.
    check_export_target(args.output, ONNX_OPSET if args.opset is None else args.opset)
    if not Path(args.checkpoint).is_dir():
        raise InputError(f"{args.checkpoint}: checkpoint folder not found")
    progress = Progress("export", args.quiet)
    progress(f"loading {args.checkpoint} as {args.dtype}")
    model = load_checkpoint(args.checkpoint, dtype=torch_dtype(args.dtype))
    kwargs = {} if args.opset is None else {"opset": args.opset}
    path = export_onnx(model, args.output, progress=progress, **kwargs)
    print(f"wrote {path}")
    return 0
