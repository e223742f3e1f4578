"""`gdn-export bench CHECKPOINT`: prefill and decode latency, tokens/s and peak memory of the fast
torch runner (gdn_export.runtime.cuda_graph.GraphRunner), optionally beside transformers, and the
bf16-vs-fp32 accuracy of both; with --quant FORMAT, beside the same checkpoint quantized
(gdn_export/cli/bench_quant.py). What is measured: gdn_export.runtime.bench."""

from __future__ import annotations

import argparse
import gc
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gdn_export.cli import bench_quant
from gdn_export.cli.common import (checkpoint_dir, Progress, add_dtype, add_overwrite, add_quiet, add_seed, check_at_least,
                                   output_file, torch_dtype)
from gdn_export.cli.runners import add_ort_kernels, check_device
from gdn_export.errors import GdnExportError, InputError

ACCURACY_STEPS = 8


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
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu; --runtime ort "
                   "on cuda needs onnxruntime-gpu)")
    p.add_argument("--op-backend", choices=("reference", "triton", "cuda"),
                   help="implementation of the gdn ops (default: reference on the CPU, triton on CUDA)")
    add_dtype(p, "bf16", help="model precision (default bf16)")
    p.add_argument("--batch", type=int, default=1, help="rows per call")
    p.add_argument("--prompt-len", type=int, default=512, help="prompt tokens per row")
    p.add_argument("--decode-steps", type=int, default=32, help="timed decode steps per run")
    p.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help="prefill in calls of at most N tokens per row (default: 4096 // batch on the GPU runner)")
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
    add_seed(p, "seed of the random prompts")
    p.add_argument("--json", metavar="OUT.json", help="also write the results as JSON (default: not written)")
    add_overwrite(p, "the --json file")
    add_quiet(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    import numpy as np

    if args.runtime == "ort":
        from gdn_export.cli import bench_ort

        return bench_ort.run(args)
    if args.onnx or args.ort_kernels != "auto":
        raise InputError("--onnx / --ort-kernels apply to --runtime ort")
    if args.checkpoint is None:
        raise InputError("--runtime torch needs a checkpoint folder")
    import torch

    from gdn_export.hf_config import read_config
    from gdn_export.layout import DeployLayout
    from gdn_export.weights.loader import check_checkpoint

    for flag, value, low in (("--batch", args.batch, 1), ("--prompt-len", args.prompt_len, 1),
                             ("--decode-steps", args.decode_steps, 1), ("--warmup", args.warmup, 0),
                             ("--repeats", args.repeats, 1)):
        check_at_least(value, low, flag)
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
    device = torch.device(args.device)
    op_backend = args.op_backend or ("triton" if device.type == "cuda" else "reference")
    check_device(args.device, op_backend)
    if args.cuda_graph and device.type != "cuda":
        raise InputError(f"--cuda-graph needs --device cuda, got --device {args.device}")
    cuda_graph = device.type == "cuda" if args.cuda_graph is None else args.cuda_graph
    progress = Progress("bench", args.quiet)
    dtype = torch_dtype(args.dtype)
    args.compile = args.compile or args.compile_mode is not None
    steps = max(args.decode_steps, ACCURACY_STEPS, args.quant_steps if args.quant else 0)
    slack = 2 * args.speculative if args.speculative else 0  # runtime.speculative.cache_slots_needed
    layout = DeployLayout.make(cache_len=args.prompt_len + steps + 1 + slack)
    result: dict = {"checkpoint": str(args.checkpoint), "device": str(device),
                    "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "dtype": args.dtype, "op_backend": op_backend, "batch": args.batch,
                    "prompt_len": args.prompt_len, "decode_steps": args.decode_steps,
                    "prefill_chunk": args.prefill_chunk, "cuda_graph": cuda_graph,
                    "compile": args.compile, "compile_mode": args.compile_mode or "default",
                    "warmup": args.warmup, "repeats": args.repeats}
    rng = np.random.default_rng(args.seed)
    _check_memory(args, layout, dtype, device)  # before the first progress line and any allocation

    prompts = rng.integers(0, read_config(Path(args.checkpoint) / "config.json").vocab_size,
                           (args.batch, args.prompt_len))
    ids = torch.from_numpy(prompts).to(device)
    setup = Setup(device, dtype, layout, op_backend, cuda_graph, progress)
    if args.quant:
        return bench_quant.run(args, result, ids, setup)
    runner, model = measure(args, args.checkpoint, ids, setup, result)
    rows = [("gdn-export", result)]

    if args.speculative:
        result["speculative"] = _speculative(args, runner, model, prompts, result, progress)
    if args.accuracy:
        result["accuracy"] = _accuracy(args, runner, prompts, device, dtype, op_backend, progress)
    del runner, model
    gc.collect()

    if args.compare_hf:
        result["transformers"] = hf = _bench_hf(args, ids, prompts, device, dtype, progress,
                                                result.get("accuracy"))
        if "prefill_ms" in hf:
            rows.append(("transformers", hf))

    print(_table(result, rows))
    if args.json:
        write_json(result, Path(args.json))
        progress(f"wrote {args.json}")
    return 0


@dataclass
class Setup:
    """What every timed model of one bench call shares."""

    device: Any
    dtype: Any
    layout: Any
    op_backend: str
    cuda_graph: bool
    progress: Callable[[str], None]


def measure(args, checkpoint, ids, setup: Setup, result: dict, label: str = "ours"):
    """Load `checkpoint` in setup.dtype on setup.device, time it on a GraphRunner over prompts ids
    [B, T] and add the timing / memory keys to `result`. Returns (runner, model): the caller drops
    them before the next model is loaded."""
    from gdn_export.cli.bench_quant import model_weights
    from gdn_export.runtime import bench as B
    from gdn_export.runtime.cuda_graph import GraphRunner
    from gdn_export.weights import load_checkpoint

    device, progress = setup.device, setup.progress
    B.reset_peak_memory(device)
    progress(f"loading {checkpoint} ({args.dtype}, {device})")
    model = load_checkpoint(checkpoint, dtype=setup.dtype, device=device)
    model.layout = setup.layout
    phases = {"load": B.peak_memory(device)[0]}
    result["parameters"], result["weights_bytes"] = model_weights(model)
    B.reset_peak_memory(device)
    runner = GraphRunner(model, device=device, op_backend=setup.op_backend, cuda_graph=setup.cuda_graph,
                         compile=args.compile, compile_mode=args.compile_mode or "default")
    result["prefill_chunk"] = args.prefill_chunk or runner.default_prefill_chunk(args.batch)
    result["states_bytes"] = B.tensor_bytes(runner.empty_states(args.batch))
    phases["setup"] = B.peak_memory(device)[0]  # fused projections, states, decode graph capture
    progress(f"{label}: {result['parameters'] / 1e9:.3f}B parameters, batch {args.batch}, prompt "
             f"{args.prompt_len}, {args.decode_steps} decode steps, {setup.op_backend} ops, "
             f"CUDA graph {'on' if setup.cuda_graph else 'off'}{', compiled' if args.compile else ''}")
    timings = B.bench_runner(runner, ids, args.decode_steps, args.warmup, args.repeats,
                             args.prefill_chunk, progress)
    result.update(timings.as_dict())
    result["peak_memory_bytes"], result["peak_memory_source"] = B.peak_memory_through(timings, device)
    if device.type == "cuda":  # the peak of each phase: where the memory above weights + states goes
        phases.update(prefill=timings.prefill_peak_bytes, decode=timings.decode_peak_bytes)
        result["peak_memory_phases"] = phases
        result["peak_memory_bytes"] = max(result["peak_memory_bytes"], phases["load"])
    return runner, model


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


def _speculative(args, runner, model, prompts, result, progress) -> dict:
    """Greedy speculative decoding on the timed runner (gdn_export.runtime.spec_bench), and whether
    its tokens are plain greedy decoding's."""
    import numpy as np
    import torch

    from gdn_export.runtime.spec_bench import bench_speculative
    from gdn_export.weights.mtp import load_mtp

    progress(f"speculative: loading the MTP head, K = {args.speculative}")
    mtp = load_mtp(args.checkpoint, model)
    out = bench_speculative(runner, mtp, prompts, args.speculative, args.decode_steps, args.warmup,
                            args.repeats, args.prefill_chunk, progress)
    ids = torch.from_numpy(prompts).to(runner.device)
    logits, states = runner.prefill_device(ids, runner.empty_states(len(prompts)), args.prefill_chunk)
    first = logits[:, -1].argmax(-1)[:, None]
    picked, _, _ = runner.decode_greedy(first, np.full(len(prompts), prompts.shape[1], np.int64), states,
                                        args.decode_steps)
    plain = np.concatenate([first.cpu().numpy(), picked.cpu().numpy()], 1)
    out["tokens_equal_plain"] = bool((out.pop("generated") == plain).all())
    out["speedup"] = out["decode_tokens_per_s"] / result["decode_tokens_per_s"]
    out["verify_over_plain_step"] = out["verify_ms"] / result["decode_ms_per_step"]
    return out


def _check_memory(args, layout, dtype, device) -> None:
    """InputError, with the numbers, when the states and K/V cache of --batch rows of --prompt-len +
    --decode-steps tokens exceed the device's memory (gdn_export.runtime.memory)."""
    import numpy as np
    import torch

    from gdn_export.hf_config import read_config
    from gdn_export.models.hybrid import HybridForCausalLM
    from gdn_export.runtime.memory import check_generation_memory, model_plan

    with torch.device("meta"):
        model = HybridForCausalLM(read_config(Path(args.checkpoint) / "config.json")).to(dtype)
    model.layout = layout
    prompts = [np.zeros(args.prompt_len, np.int64)] * args.batch
    check_generation_memory(model_plan(model, device), prompts, args.decode_steps, keep_logits=False,
                            hint="lower --batch, --prompt-len or --decode-steps")


def _accuracy(args, runner, prompts, device, dtype, op_backend, progress) -> dict:
    """Our model in args.dtype against our fp32 model (forced to the fp32 model's greedy tokens),
    and the fast fp32 runner's greedy tokens against the eager runner's."""
    import numpy as np
    import torch

    from gdn_export.runtime import bench as B
    from gdn_export.runtime.base import generate
    from gdn_export.runtime.cuda_graph import GraphRunner
    from gdn_export.runtime.torch_runner import TorchRunner
    from gdn_export.weights import load_checkpoint

    progress(f"accuracy: fp32 model, {ACCURACY_STEPS} greedy steps")
    ref_model = load_checkpoint(args.checkpoint, dtype=torch.float32, device=device)
    ref_model.layout = runner.layout
    eager = TorchRunner(ref_model, device=device, op_backend=op_backend)
    want = generate(eager, prompts, ACCURACY_STEPS + 1)
    forced = want.generated[:, :ACCURACY_STEPS]
    truth = np.stack([lg[:, -1] for lg in want.step_logits])  # [S + 1, B, V]
    fast32 = GraphRunner(ref_model, device=device, op_backend=op_backend, cuda_graph=runner.cuda_graph)
    got32 = generate(fast32, prompts, ACCURACY_STEPS + 1)
    out = {"steps": ACCURACY_STEPS,
           "fp32_fast_tokens_equal_eager": bool((got32.generated == want.generated).all())}
    del fast32, eager, ref_model
    gc.collect()
    progress(f"accuracy: {args.dtype} model, the fp32 model's tokens forced")
    out["ours_vs_fp32"] = B.compare_logits(B.forced_logits_ours(runner, prompts, forced), truth)
    out["_truth"], out["_forced"] = truth, forced  # for transformers' comparison; not in the JSON
    return out


def _bench_hf(args, ids, prompts, device, dtype, progress, accuracy) -> dict:
    import torch

    from gdn_export.runtime import bench as B

    B.reset_peak_memory(device)
    progress(f"transformers: loading {args.checkpoint} ({args.dtype}, {device})")
    try:
        model = B.load_hf(args.checkpoint, dtype, device)
    except GdnExportError as exc:
        progress(f"transformers skipped: {exc}")
        return {"skipped": str(exc)}
    out = {"class": type(model).__name__}
    timings = B.bench_hf(model, ids, args.decode_steps, args.warmup, args.repeats, progress)
    out.update(timings.as_dict())
    out["peak_memory_bytes"], out["peak_memory_source"] = B.peak_memory_through(timings, device)
    if accuracy is not None:
        truth, forced = accuracy["_truth"], accuracy["_forced"]
        logits = B.forced_logits_hf(model, prompts, forced, device)
        del model
        gc.collect()
        B.reset_peak_memory(device)
        progress("transformers: fp32 model, for its own accuracy against it")
        model32 = B.load_hf(args.checkpoint, torch.float32, device)
        hf_truth = B.forced_logits_hf(model32, prompts, forced, device)
        out["accuracy"] = {"hf_vs_fp32_hf": B.compare_logits(logits, hf_truth),
                           "hf_vs_fp32_ours": B.compare_logits(logits, truth),
                           "fp32_hf_vs_fp32_ours": B.compare_logits(hf_truth, truth)}
    return out


def _fmt(value, spec) -> str:
    return "-" if value is None else format(value, spec)


def _compiled(result: dict) -> str:
    if not result["compile"]:
        return ""
    mode = result.get("compile_mode", "default")
    return ", compiled" if mode == "default" else f", compiled ({mode})"


def _table(result: dict, rows) -> str:
    lines = [f"batch {result['batch']}, prompt {result['prompt_len']}, {result['decode_steps']} decode "
             f"steps, {result['dtype']}, {result['device_name']}, ops {result['op_backend']}, CUDA graph "
             f"{'on' if result['cuda_graph'] else 'off'}{_compiled(result)} "
             f"(medians of {result['repeats']})", "",
             "| | prefill ms | decode ms/step | decode tokens/s | peak memory MiB |",
             "|---|---|---|---|---|"]
    for name, r in rows:
        lines.append(f"| {name} | {_fmt(r.get('prefill_ms'), '.2f')} | {_fmt(r.get('decode_ms_per_step'), '.3f')} "
                     f"| {_fmt(r.get('decode_tokens_per_s'), '.1f')} | {r['peak_memory_bytes'] / 2**20:.1f} |")
    lines.append(f"\nweights {result['weights_bytes'] / 2**20:.1f} MiB + states {result['states_bytes'] / 2**20:.1f} "
                 f"MiB; peak memory from {result['peak_memory_source']}")
    phases = result.get("peak_memory_phases")
    if phases:
        lines.append("ours' peak by phase, MiB: " + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in phases.items()))
    hf = result.get("transformers", {})
    if "skipped" in hf:
        lines.append(f"transformers: skipped ({hf['skipped']})")
    spec = result.get("speculative")
    if spec:
        lines.append(f"speculative, K = {spec['k']} (greedy, MTP head, CUDA graph "
                     f"{'on' if spec['cuda_graph'] else 'off'}): {spec['decode_tokens_per_s']:.1f} tokens/s = "
                     f"{spec['speedup']:.2f}x plain decode; {spec['tokens_per_step']:.2f} tokens per verify step "
                     f"(drafts accepted {spec['acceptance_rate']:.1%}); round {spec['round_ms']:.3f} ms (draft "
                     f"{spec['draft_ms']:.3f} + verify {spec['verify_ms']:.3f}) against a plain step "
                     f"{result['decode_ms_per_step']:.3f} ms (verify / plain {spec['verify_over_plain_step']:.2f}); "
                     f"tokens equal plain greedy: {spec['tokens_equal_plain']}")
    acc = result.get("accuracy")
    if acc:
        lines.append(f"accuracy vs the fp32 model ({acc['steps']} forced steps): ours {result['dtype']} rel RMS "
                     f"{acc['ours_vs_fp32']['rel_rms']:.4f}, argmax agreement {acc['ours_vs_fp32']['argmax_agreement']:.3f}; "
                     f"fp32 fast-runner tokens equal eager: {acc['fp32_fast_tokens_equal_eager']}")
        hacc = hf.get("accuracy")
        if hacc:
            lines.append(f"transformers {result['dtype']} vs its fp32 model: rel RMS {hacc['hf_vs_fp32_hf']['rel_rms']:.4f}, "
                         f"argmax agreement {hacc['hf_vs_fp32_hf']['argmax_agreement']:.3f}; vs our fp32 model: "
                         f"rel RMS {hacc['hf_vs_fp32_ours']['rel_rms']:.4f}")
    return "\n".join(lines)


def write_json(result: dict, path: Path) -> None:
    """--json: the result dict without its private ("_") keys, written atomically (bench and
    bench --runtime ort / --quant)."""
    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if not k.startswith("_")}
        return x

    from gdn_export.paths import atomic_file

    with atomic_file(path, f"--json {path}") as tmp:
        tmp.write_text(json.dumps(clean(result), indent=2), encoding="utf-8")
