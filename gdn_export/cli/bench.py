"""`gdn-export bench CHECKPOINT`: prefill and decode latency, tokens/s and peak memory of the fast
torch runner (gdn_export.runtime.cuda_graph.GraphRunner), optionally beside transformers, and the
bf16-vs-fp32 accuracy of both; with --quant FORMAT, beside the same checkpoint quantized
(gdn_export/cli/bench_quant.py); with --runtime ort, an exported file on ONNX Runtime
(gdn_export/cli/bench_ort.py). This module parses, checks and prints; what is measured is
gdn_export.runtime.bench_checkpoint's (and gdn_export.runtime.bench's)."""

from __future__ import annotations

import argparse
import gc
from pathlib import Path

from gdn_export.cli import bench_ort, bench_quant
from gdn_export.cli.bench_common import check_sizes, table, write_json
from gdn_export.cli.common import (Progress, add_device, add_dtype, add_op_backend, add_overwrite, add_quiet, add_seed,
                                   check_at_least, checkpoint_dir, device_of, dtype_of, op_backend_of, output_file,
                                   torch_dtype)
from gdn_export.cli.runners import add_ort_kernels, check_device
from gdn_export.errors import InputError


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="time prefill and decode of a checkpoint (and transformers)",
                       description="Time prefill and greedy decode of a checkpoint on the fast torch "
                       "runner (static states, CUDA-graph decode), print a table on stdout, progress on "
                       "stderr. Times are medians of --repeats runs after --warmup runs.")
    p.add_argument("checkpoint", nargs="?", help="folder with config.json and *.safetensors (--runtime torch)")
    p.add_argument("--runtime", choices=("torch", "ort"), default="torch",
                   help="torch (default): the checkpoint on the fast torch runner; ort: --onnx on ONNX "
                   "Runtime (gdn_export/cli/bench_ort.py)")
    p.add_argument("--onnx", help="--runtime ort: the exported file to time (default: none; required there)")
    add_ort_kernels(p)
    g = p.add_argument_group("model")
    add_device(g, "the model", "--runtime ort on cuda needs onnxruntime-gpu")
    add_op_backend(g)
    add_dtype(g, "the model")
    p.add_argument("--batch", type=int, default=1, help="rows per call")
    p.add_argument("--prompt-len", type=int, default=512, help="prompt tokens per row")
    p.add_argument("--decode-steps", type=int, default=32, help="timed decode steps per run")
    p.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help="prefill in calls of at most N tokens per row (default: the GPU runner sizes them from the "
                   "prompt and the free memory, 4096..16384 tokens a call over the batch)")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                   help="capture the decode step as a CUDA graph (default: on with a CUDA --device; "
                   "--no-cuda-graph turns it off)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model before capturing (fuses the small ops; default: off)")
    p.add_argument("--compile-mode", choices=("default", "max-autotune"), default=None,
                   help="torch.compile mode (implies --compile); max-autotune times inductor's Triton "
                   "GEMMs against cuBLAS per shape (minutes of compiling; default: default)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs; medians (default 3)")
    p.add_argument("--compare-hf", action="store_true",
                   help="also time transformers (AutoModelForCausalLM, same dtype and device; default: off)")
    p.add_argument("--accuracy", action="store_true",
                   help="compare the logits with the fp32 model's on the same prompts (and "
                   "transformers' with its fp32 model's when --compare-hf); fp32 tokens of the fast "
                   "runner against the eager runner (default: off)")
    p.add_argument("--speculative", type=int, default=None, metavar="K",
                   help="also time greedy speculative decoding with the checkpoint's MTP head drafting K "
                   "tokens a round (1..16) on the same runner: tokens/s against plain decode, tokens per "
                   "verify step, the draft and verify costs against a plain step (default: off)")
    bench_quant.add_arguments(p)
    add_seed(p, "the random prompts")
    p.add_argument("--json", metavar="OUT.json", help="also write the results as JSON (default: not written)")
    add_overwrite(p, "the --json file")
    add_quiet(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    if args.runtime == "ort":
        return bench_ort.run(args)
    if args.onnx or args.ort_kernels != "auto":
        raise InputError("--onnx / --ort-kernels apply to --runtime ort")
    if args.checkpoint is None:
        raise InputError("--runtime torch needs a checkpoint folder")
    import numpy as np
    import torch

    from gdn_export.hf_config import read_config
    from gdn_export.layout import DeployLayout
    from gdn_export.ops.backends import current_name
    from gdn_export.runtime import bench_checkpoint as BC
    from gdn_export.runtime.spec_bench import measure_speculative
    from gdn_export.weights.loader import check_checkpoint

    check_sizes(args)
    if args.prefill_chunk is not None:
        check_at_least(args.prefill_chunk, 1, "--prefill-chunk")
    if args.json:
        output_file(args.json, "--json", args)
    checkpoint_dir(args.checkpoint)
    check_checkpoint(args.checkpoint)  # files, names, shapes, dtypes: before the first progress line
    if args.speculative is not None:
        _check_speculative(args)
    if args.quant:
        bench_quant.check(args)  # format, a 16-bit checkpoint, ModelOpt present: before any work
    else:
        bench_quant.check_unused(args)
    device_name = device_of(args)
    op_backend = op_backend_of(args, device_name)
    check_device(device_name, op_backend)
    device = torch.device(device_name)
    if args.cuda_graph and device.type != "cuda":
        raise InputError(f"--cuda-graph needs --device cuda, got --device {device_name}")
    cuda_graph = device.type == "cuda" if args.cuda_graph is None else args.cuda_graph
    dtype_name = dtype_of(args)
    compile_ = args.compile or args.compile_mode is not None
    steps = max(args.decode_steps, BC.ACCURACY_STEPS, args.quant_steps if args.quant else 0)
    slack = 2 * args.speculative if args.speculative else 0  # runtime.speculative.cache_slots_needed
    setup = BC.Setup(device, torch_dtype(dtype_name), dtype_name,
                     DeployLayout.make(cache_len=args.prompt_len + steps + 1 + slack),
                     op_backend, cuda_graph, batch=args.batch, prompt_len=args.prompt_len,
                     decode_steps=args.decode_steps, warmup=args.warmup, repeats=args.repeats,
                     prefill_chunk=args.prefill_chunk, compile=compile_, compile_mode=args.compile_mode or "default",
                     progress=Progress("bench", args.quiet))
    BC.check_memory(args.checkpoint, setup)  # before the first progress line and any allocation
    result: dict = {"checkpoint": str(args.checkpoint), "device": str(device),
                    "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "dtype": dtype_name, "op_backend": op_backend or current_name(), "batch": args.batch,
                    "prompt_len": args.prompt_len, "decode_steps": args.decode_steps,
                    "prefill_chunk": args.prefill_chunk, "cuda_graph": cuda_graph,
                    "compile": compile_, "compile_mode": args.compile_mode or "default",
                    "warmup": args.warmup, "repeats": args.repeats}
    prompts = np.random.default_rng(args.seed).integers(
        0, read_config(Path(args.checkpoint) / "config.json").vocab_size, (args.batch, args.prompt_len))
    ids = torch.from_numpy(prompts).to(device)
    if args.quant:
        return bench_quant.run(args, result, ids, setup)
    runner, model = BC.measure(args.checkpoint, ids, setup, result)
    rows = [("gdn-export", result)]
    if args.speculative:
        result["speculative"] = measure_speculative(args.checkpoint, runner, model, prompts, args.speculative, setup,
                                                    result)
    if args.accuracy:
        result["accuracy"] = BC.accuracy(args.checkpoint, runner, prompts, setup)
    del runner, model
    gc.collect()
    if args.compare_hf:
        result["transformers"] = hf = BC.bench_transformers(args.checkpoint, ids, prompts, setup,
                                                            result.get("accuracy"))
        if "prefill_ms" in hf:
            rows.append(("transformers", hf))
    print(table(result, rows))
    if args.json:
        write_json(result, Path(args.json), args.overwrite)
        setup.progress(f"wrote {args.json}")
    return 0


def _check_speculative(args) -> None:
    """--speculative: K in range, not with --quant, a checkpoint with an MTP head (before any work)."""
    from gdn_export.hf_config import read_config
    from gdn_export.weights.mtp import check_has_mtp

    if not 1 <= args.speculative <= 16:
        raise InputError(f"--speculative must be in [1, 16], got {args.speculative}")
    if args.quant:
        raise InputError("--speculative times the checkpoint as it is; give a quantized checkpoint instead "
                         "of --quant")
    check_has_mtp(read_config(Path(args.checkpoint) / "config.json"), args.checkpoint)
