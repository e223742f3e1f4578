"""Where a decode step's (or a prefill's) time goes: its kernels, grouped (issue 9).

    python benchmarks/decode_profile.py CHECKPOINT [--batch 1] [--op-backend triton] [--compile]
                                        [--compile-mode default|max-autotune]
                                        [--steps 20] [--prompt-len 64] [--prefill] [--out DIR]

Loads the checkpoint as `gdn-export bench` does (bf16, GraphRunner), prefills a short prompt, then
records `steps` greedy decode steps (graph replays) under torch.profiler and reports, per step:
wall time, the number of kernels, their summed device time, the idle gaps between them, and a table
of kernel groups (GEMMs, GDN / conv ops, attention, norms, elementwise, copies...) with counts and
times, plus the 25 costliest kernel names. Writes decode_profile.md / .json under --out (default $OUT, else a new temp folder).
--prefill profiles `steps` prefills of the prompt instead (one call each, no CUDA graph) and adds the
host's side: how long a call takes to return when the GPU's queue is empty at its start (near the
wall time, the launches bound the prefill) and a cProfile of the calls.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections import defaultdict

import numpy as np
import torch

from gpu_timing import save_table
from records import out_dir

GROUPS = [  # first match wins; patterns on lower-cased kernel names
    # first: SDPA's fmha_cutlass* kernels would be GEMMs, and "gdn recurrent"'s `decode` would take
    # the split-KV attn_decode_* kernels
    ("attention", r"attention|attn|flash|fmha|sdpa|softmax"),
    # the quantized linear ops' Triton kernels (kernels/quant_linear/triton/)
    ("quantized gemm (triton)", r"skinny_kernel|fp8_gemm_kernel|int4_gemm_kernel|gemv_kernel"),
    ("x quantization / int4 dequant", r"quant_tensor_kernel|quant_group_kernel|int4_dequant_kernel"),
    ("gemm", r"gemm|cutlass|cublas|sm90_xmma|nvjet|matmul|gemv|splitk"),
    ("gdn recurrent", r"gated_delta|gdr|recurrent|fused_recurrent|decode"),
    ("conv", r"conv1d|causal_conv"),
    ("norm", r"norm|rsqrt"),
    ("reduce / argmax", r"reduce|argmax|max_|sum"),
    ("copy / cast", r"copy|cast|to_copy|fill|memcpy|memset"),
    ("index / scatter", r"index|scatter|gather|embedding|where"),
    ("elementwise", r"elementwise|vectorized|unrolled|triton_poi|pointwise"),
]


def group_of(name: str) -> str:
    low = name.lower()
    for group, pattern in GROUPS:
        if re.search(pattern, low):
            return group
    return "other"


def host_side(call, calls: int) -> tuple[float, str]:
    """(median ms for `call` to return with an empty queue at its start, a text report: cProfile of
    `calls` calls (the 30 functions with the most own time, the 40 with the most cumulative time) and
    torch.profiler's CPU-side table of one call, CUDA runtime calls included)."""
    import cProfile
    import io
    import pstats

    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as ops:  # CUDA runtime calls: syncs, mallocs
        call()
        torch.cuda.synchronize()
    text.write("\ntorch.profiler, one call, by self CPU time:\n")
    text.write(ops.key_averages().table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=70))
    return statistics.median(times), text.getvalue()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--op-backend", default="triton")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--compile", action="store_true")
    p.add_argument("--compile-mode", choices=("default", "max-autotune"), default="default",
                   help="torch.compile mode (max-autotune implies --compile)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--prefill", action="store_true", help="profile prefills of the prompt instead")
    p.add_argument("--out", default=None)
    p.add_argument("--tuned", help="quantized kernels' launch parameters (JSON of quant_linear_bench.py --tuned)")
    args = p.parse_args()
    args.out = out_dir(args.out, "decode_profile")
    if args.tuned:
        import json

        from quant_linear_bench import apply_tuned

        apply_tuned(json.load(open(args.tuned)))

    from torch.profiler import ProfilerActivity, profile

    from gdn_export.layout import DeployLayout
    from gdn_export.runtime.cuda_graph import GraphRunner
    from gdn_export.weights import load_checkpoint

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    device = torch.device("cuda")
    model = load_checkpoint(args.checkpoint, dtype=dtype, device=device)
    model.layout = DeployLayout.make(cache_len=args.prompt_len + 2 * args.steps + 8)
    args.compile = args.compile or args.compile_mode != "default"
    runner = GraphRunner(model, device=device, op_backend=args.op_backend, compile=args.compile,
                         compile_mode=args.compile_mode)
    B, T = args.batch, args.prompt_len
    ids = torch.randint(0, model.config.vocab_size, (B, T), device=device)

    def run_decode(steps):
        logits, states = runner.prefill_device(ids, runner.empty_states(B))
        token = logits[:, -1].argmax(-1)[:, None]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.decode_greedy(token, np.full(B, T, np.int64), states, steps)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3 / steps

    def run_prefill(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            runner.prefill_device(ids, runner.empty_states(B), T)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3 / steps

    timed = run_prefill if args.prefill else run_decode
    timed(args.steps)  # capture, compiles
    wall = statistics.median(timed(args.steps) for _ in range(5))
    host = host_profile = None
    if args.prefill:
        host, host_profile = host_side(lambda: runner.prefill_device(ids, runner.empty_states(B), T), args.steps)
    if args.prefill:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run_prefill(args.steps)
    else:
        logits, states = runner.prefill_device(ids, runner.empty_states(B))
        token = logits[:, -1].argmax(-1)[:, None]
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            runner.decode_greedy(token, np.full(B, T, np.int64), states, args.steps)
            torch.cuda.synchronize()

    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels.sort(key=lambda e: e.time_range.start)
    busy_us = sum(e.device_time for e in kernels)  # device_time: us
    span_us = kernels[-1].time_range.end - kernels[0].time_range.start if kernels else 0.0
    per_group = defaultdict(lambda: [0, 0.0])
    per_name = defaultdict(lambda: [0, 0.0])
    for e in kernels:
        g = per_group[group_of(e.name)]
        g[0] += 1
        g[1] += e.device_time
        n = per_name[e.name[:90]]
        n[0] += 1
        n[1] += e.device_time
    s = args.steps
    result = {"checkpoint": args.checkpoint, "batch": B, "op_backend": args.op_backend,
              "compile": args.compile, "compile_mode": args.compile_mode, "dtype": args.dtype, "steps": s,
              "prefill": args.prefill, "prompt_len": T, "wall_ms_per_step": wall, "host_ms_per_step": host,
              "kernels_per_step": len(kernels) / s,
              "kernel_busy_ms_per_step": busy_us / s / 1e3,
              "profiled_span_ms_per_step": span_us / s / 1e3,
              "groups": {k: {"kernels_per_step": v[0] / s, "ms_per_step": v[1] / s / 1e3}
                         for k, v in per_group.items()},
              "top": [{"name": k, "per_step": v[0] / s, "us_per_step": v[1] / s}
                      for k, v in sorted(per_name.items(), key=lambda kv: -kv[1][1])[:25]]}
    what = f"Prefill ({T} tokens per row) profile" if args.prefill else "Decode step profile"
    lines = [f"# {what}: batch {B}, {args.op_backend} ops, {args.dtype}"
             f"{', torch.compile' if args.compile else ''}{' (max-autotune)' if args.compile_mode != 'default' else ''}", "",
             f"wall {wall:.3f} ms/step (unprofiled median of 5 x {s} steps); {len(kernels) / s:.0f} "
             f"kernels/step, busy {busy_us / s / 1e3:.3f} ms/step, span {span_us / s / 1e3:.3f} ms/step "
             f"(span - busy = gaps between kernels)"
             + (f"; host {host:.3f} ms/call (the call's return, its queue empty at the start: near wall, the "
                f"host's launches bound the prefill)" if host is not None else ""), "",
             "| group | kernels/step | ms/step | share of busy |", "|---|---|---|---|"]
    for k, v in sorted(per_group.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {k} | {v[0] / s:.0f} | {v[1] / s / 1e3:.3f} | {v[1] / max(busy_us, 1e-9):.0%} |")
    lines += ["", "| kernel | per step | us/step |", "|---|---|---|"]
    for row in result["top"]:
        lines.append(f"| `{row['name']}` | {row['per_step']:.0f} | {row['us_per_step']:.1f} |")
    if host_profile:
        lines += ["", "Host side of the profiled calls (cProfile, by own time; its overhead inflates them):", "",
                  "```", host_profile.rstrip(), "```"]
    save_table(args.out, "decode_profile", result, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
