"""`gdn-export bench --runtime ort --onnx model.onnx [--device cuda]`: the checks and the table of
an exported file's prefill and decode latency on ONNX Runtime (measured by
gdn_export.runtime.bench_ort)."""

from __future__ import annotations

from pathlib import Path

from gdn_export.cli import bench_quant
from gdn_export.cli.bench_common import check_sizes, ort_table, write_json
from gdn_export.cli.common import Progress, device_of, input_file, output_file
from gdn_export.errors import InputError

def run(args) -> int:
    from gdn_export.runtime import ort_device
    from gdn_export.runtime.bench_ort import bench_ort
    from gdn_export.runtime.ort_runner import OrtRunner

    if not args.onnx:
        raise InputError("--runtime ort needs --onnx model.onnx (the exported file to time)")
    input_file(args.onnx, "ONNX file")
    if args.checkpoint is not None:
        raise InputError(f"--runtime ort times --onnx alone: drop the checkpoint argument ({args.checkpoint})")
    if args.quant:
        raise InputError("--quant applies to --runtime torch only")
    bench_quant.check_unused(args)
    check_sizes(args)
    for flag, value in (("--compare-hf", args.compare_hf), ("--accuracy", args.accuracy),
                        ("--compile", args.compile or args.compile_mode), ("--op-backend", args.op_backend),
                        ("--cuda-graph", args.cuda_graph), ("--dtype", args.dtype)):
        if value:
            raise InputError(f"{flag} applies to --runtime torch only"
                             + (" (an exported file keeps the precision it was exported in)" if flag == "--dtype" else ""))
    if args.json:
        output_file(args.json, "--json", args)
    device = device_of(args)
    providers = ort_device.providers_for(ort_device.parse_device(device))  # one line before loading
    from gdn_export.onnx.ort_native import check_file

    check_file(args.onnx, args.ort_kernels, providers)
    progress = Progress("bench", args.quiet)
    progress(f"loading {args.onnx} in ONNX Runtime on {device}")
    runner = OrtRunner(args.onnx, device=device, kernels=args.ort_kernels)
    progress(f"ort on {runner.device}: {runner.kernels_note}")
    result = {"onnx": str(args.onnx), "runtime": "ort", "device": device, "batch": args.batch,
              "prompt_len": args.prompt_len, "decode_steps": args.decode_steps, "repeats": args.repeats}
    result.update(bench_ort(runner, batch=args.batch, prompt_len=args.prompt_len, decode_steps=args.decode_steps,
                            warmup=args.warmup, repeats=args.repeats, seed=args.seed))
    print(ort_table(result, Path(args.onnx).name))
    if args.json:
        write_json(result, Path(args.json), args.overwrite)
        progress(f"wrote {args.json}")
    return 0
