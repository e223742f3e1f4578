"""`gdn-export validate CHECKPOINT --onnx model.onnx [--engine model.engine]`: the parity report."""

from __future__ import annotations

from gdn_export.cli.common import DTYPES, Progress, add_quiet, add_tolerances, parse_tolerances
from gdn_export.cli.runners import open_runner
from gdn_export.errors import InputError


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="compare PyTorch with ONNX Runtime / TensorRT",
                       description="Run the PyTorch model and each other backend on the same random "
                       "prompts (prefill, then forced decode steps), print max abs / rel error of "
                       "the logits and of every state, and exit 1 when any is over tolerance.")
    p.add_argument("checkpoint", help="folder with config.json and *.safetensors (the reference)")
    p.add_argument("--onnx", help="exported model to run in ONNX Runtime")
    p.add_argument("--engine", help="TensorRT engine to run (needs TensorRT and a supported GPU)")
    p.add_argument("--plugins", help="path of libgdn_plugins.so for --engine")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="reference precision (default: the ONNX file's, else fp32)")
    p.add_argument("--device", default="cpu", help="device of the PyTorch reference")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=37)
    p.add_argument("--decode-steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="REPORT.json", help="also write the report as JSON")
    p.add_argument("--logits-only", action="store_true", help="print only the logits rows")
    add_tolerances(p)
    add_quiet(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    from gdn_export.validate import DEFAULT_TOLERANCES, format_table, run_parity, write_json

    if not (args.onnx or args.engine):
        raise InputError("nothing to validate: give --onnx and/or --engine")
    progress = Progress("validate", args.quiet)
    candidates = []
    if args.onnx:
        progress(f"loading {args.onnx} in ONNX Runtime")
        candidates.append(open_runner(args.onnx, "ort"))
    if args.engine:
        progress(f"loading {args.engine} in TensorRT")
        candidates.append(open_runner(args.engine, "trt", plugins=args.plugins))
    dtype = args.dtype or _dtype_of(candidates[0]) or "fp32"
    progress(f"loading {args.checkpoint} in PyTorch ({dtype}, {args.device})")
    reference = open_runner(args.checkpoint, "torch", dtype=dtype, device=args.device)
    atol, rtol = DEFAULT_TOLERANCES[{"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[dtype]]
    tolerances = parse_tolerances(args.atol, args.rtol, atol, rtol)
    report = run_parity(reference, candidates, vocab_size=reference.vocab_size, tolerances=tolerances,
                        batch=args.batch, prompt_len=args.prompt_len,
                        decode_steps=args.decode_steps, seed=args.seed, progress=progress)
    print(format_table(report, states=not args.logits_only))
    if args.json:
        write_json(report, args.json)
        progress(f"wrote {args.json}")
    return 0 if report.passed else 1


def _dtype_of(runner) -> str | None:
    """The activation precision a runner reports (fp32 / fp16 / bf16), if it knows."""
    return getattr(runner, "dtype_name", None)
