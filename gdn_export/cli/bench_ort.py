"""`gdn-export bench --runtime ort --onnx model.onnx [--device cuda]`: prefill and decode latency of an
exported file on ONNX Runtime (gdn_export.runtime.ort_runner.OrtRunner: native kernels where they
apply, IOBinding on device buffers with --device cuda)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from gdn_export.cli.common import Progress, check_at_least, input_file, output_file
from gdn_export.errors import InputError


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def run(args) -> int:
    """Times on `args.onnx` (run_with_iobinding returns once the logits are on the host, so the
    host clock measures the device's work too)."""
    import numpy as np

    from gdn_export.runtime import ort_device
    from gdn_export.runtime.ort_runner import OrtRunner

    if not args.onnx:
        raise InputError("--runtime ort needs --onnx model.onnx (the exported file to time)")
    input_file(args.onnx, "ONNX file")
    if args.checkpoint is not None:
        raise InputError(f"--runtime ort times --onnx alone: drop the checkpoint argument ({args.checkpoint})")
    if args.quant:
        raise InputError("--quant applies to --runtime torch only")
    from gdn_export.cli import bench_quant

    bench_quant.check_unused(args)
    for flag, value, low in (("--batch", args.batch, 1), ("--prompt-len", args.prompt_len, 1),
                             ("--decode-steps", args.decode_steps, 1), ("--warmup", args.warmup, 0),
                             ("--repeats", args.repeats, 1)):
        check_at_least(value, low, flag)
    for flag, value in (("--compare-hf", args.compare_hf), ("--accuracy", args.accuracy),
                        ("--compile", args.compile or args.compile_mode), ("--op-backend", args.op_backend),
                        ("--cuda-graph", args.cuda_graph)):
        if value:
            raise InputError(f"{flag} applies to --runtime torch only")
    if args.json:
        output_file(args.json, "--json", args)
    providers = ort_device.providers_for(ort_device.parse_device(args.device))  # one line before loading
    from gdn_export.onnx.ort_native import check_file

    check_file(args.onnx, args.ort_kernels, providers)
    progress = Progress("bench", args.quiet)
    progress(f"loading {args.onnx} in ONNX Runtime on {args.device}")
    runner = OrtRunner(args.onnx, device=args.device, kernels=args.ort_kernels)
    progress(f"ort on {runner.device}: {runner.kernels_note}")
    need = args.prompt_len + args.decode_steps
    if runner.layout.inplace and not runner.layout.streaming and need > runner.layout.cache_len:
        raise InputError(f"--prompt-len + --decode-steps = {need} exceeds the file's cache of "
                         f"{runner.layout.cache_len} slots (export with --max-cache-len {need})")
    ids = np.random.default_rng(args.seed).integers(0, runner.vocab_size, (args.batch, args.prompt_len),
                                                    dtype=np.int64)
    token = ids[:, -1:]
    state = {}

    def prefill():
        state["s"] = runner.forward(ids, 0, runner.empty_states(args.batch))[1]

    def decode():
        s = state["s"]
        for i in range(args.decode_steps):
            s = runner.forward(token, args.prompt_len + i, s)[1]
        state["s"] = s

    for _ in range(args.warmup):
        prefill()
        decode()
    prefill_ms = _median_ms(prefill, args.repeats)
    decode_ms = []
    for _ in range(args.repeats):
        prefill()
        decode_ms.append(_median_ms(decode, 1) / args.decode_steps)
    step = statistics.median(decode_ms)
    result = {"onnx": str(args.onnx), "runtime": "ort", "device": args.device, "kernels": runner.kernels,
              "kernels_note": runner.kernels_note, "batch": args.batch, "prompt_len": args.prompt_len,
              "decode_steps": args.decode_steps, "repeats": args.repeats, "prefill_ms": prefill_ms,
              "decode_ms_per_step": step, "decode_tokens_per_s": 1e3 * args.batch / step}
    print(f"ONNX Runtime ({runner.kernels}) on {args.device}: batch {args.batch}, prompt {args.prompt_len}, "
          f"{args.decode_steps} decode steps (medians of {args.repeats})\n")
    print("| | prefill ms | decode ms/step | decode tokens/s |\n|---|---|---|---|")
    print(f"| {Path(args.onnx).name} | {prefill_ms:.2f} | {step:.3f} | {result['decode_tokens_per_s']:.1f} |")
    if args.json:
        from gdn_export.cli.bench import write_json

        write_json(result, Path(args.json))
        progress(f"wrote {args.json}")
    return 0
