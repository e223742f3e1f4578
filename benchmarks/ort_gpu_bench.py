"""ONNX Runtime CUDA EP (our graph, native com.microsoft kernels) vs our fast torch runner, side by side.

    python benchmarks/make_random_checkpoint.py /tmp/q35 --size 1.6b --device cuda
    python benchmarks/ort_gpu_bench.py /tmp/q35 [--dtype bf16] [--prompt 1024] [--steps 64]
        [--batch 1] [--onnx-ops gdn|standard|ort] [--onnx /tmp/q35.onnx] [--json out.json]

Needs onnxruntime-gpu (with CUDAExecutionProvider; `onnxruntime.preload_dlls()` finds the CUDA 13
libraries of torch's nvidia-* wheels) and a GPU. Exports the checkpoint (unless --onnx is given) with
cache length prompt + steps + 1, then on the same prompts: OrtRunner(device="cuda", kernels="native")
(IOBinding, states on the device, K/V in place) and GraphRunner (gdn_export.runtime.cuda_graph, the
fast torch path, triton ops, CUDA graph decode). A bf16 graph runs as on the CPU (bf16 tensors as
fp32 rounded to bf16, gdn_export.onnx.bf16), which costs ORT two casts a bf16 tensor: compare
--dtype fp16 too. Times the prefill (median of 3) and the decode step
(median over --steps greedy steps, each synchronised); prints a table with the ratio ORT / torch and
whether the greedy tokens agree. Also prints the kernel choice line (ORT falls back to function
bodies where its CUDA build lacks the contrib kernels: that is then said, not hidden).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np


def _sync():
    import torch

    torch.cuda.synchronize()


def _bench(runner, ids, steps):
    """(prefill s, decode s per step, generated tokens [B, steps])."""
    times = []
    for _ in range(3):
        states = runner.empty_states(ids.shape[0])
        _sync()
        t0 = time.perf_counter()
        logits, states = runner.forward(ids, 0, states)
        _sync()
        times.append(time.perf_counter() - t0)
    token = np.asarray(logits)[:, -1].argmax(-1)[:, None].astype(np.int64)
    step_times, tokens = [], []
    for i in range(steps):
        _sync()
        t0 = time.perf_counter()
        logits, states = runner.forward(token, ids.shape[1] + i, states)
        _sync()
        step_times.append(time.perf_counter() - t0)
        token = np.asarray(logits)[:, -1].argmax(-1)[:, None].astype(np.int64)
        tokens.append(token[:, 0])
    return statistics.median(times), statistics.median(step_times), np.stack(tokens, 1)


def main(argv=None) -> int:
    import onnxruntime as ort
    import torch

    from gdn_export.layout import DeployLayout
    from gdn_export.onnx import export_onnx
    from gdn_export.runtime.cuda_graph import GraphRunner
    from gdn_export.runtime.ort_runner import OrtRunner
    from gdn_export.weights import load_checkpoint

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--prompt", type=int, default=1024)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--onnx-ops", choices=("gdn", "standard", "ort"), default="gdn",
                   help="the form of the export (docs/onnx_forms.md; benchmarks/ort_gpu_forms.py times all three)")
    p.add_argument("--onnx", help="an export of the checkpoint with this cache length (default: export it)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    from gdn_export.runtime import ort_device

    ort_device.providers_for(ort_device.parse_device("cuda"))  # onnxruntime-gpu: one line, before the export
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    layout = DeployLayout.make(cache_len=args.prompt + args.steps + 1)
    model = load_checkpoint(args.checkpoint, dtype=dtype)
    model.layout = layout
    onnx_path = Path(args.onnx or f"{args.checkpoint.rstrip('/')}-{args.dtype}-{args.onnx_ops}.onnx")
    if not onnx_path.exists():
        print(f"exporting {onnx_path}", flush=True)
        export_onnx(model.cpu(), onnx_path, onnx_ops=args.onnx_ops, progress=print)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (args.batch, args.prompt), dtype=np.int64)
    ort_runner = OrtRunner(onnx_path, device="cuda", kernels="auto")
    print(f"ORT {ort.__version__}: {ort_runner.kernels_note}", flush=True)
    ort_prefill, ort_decode, ort_tokens = _bench(ort_runner, ids, args.steps)
    del ort_runner
    torch_runner = GraphRunner(model.cuda(), device="cuda", op_backend="triton")
    t_prefill, t_decode, t_tokens = _bench(torch_runner, ids, args.steps)
    rows = [(f"ORT CUDA EP (ours, {args.onnx_ops} form)", ort_prefill, ort_decode),
            ("torch GraphRunner (triton ops, CUDA graph)", t_prefill, t_decode)]
    print(f"| {torch.cuda.get_device_name()}, {args.dtype}, batch {args.batch} | prefill {args.prompt} (ms) "
          f"| decode step (ms) |")
    print("|---|---|---|")
    for name, pre, dec in rows:
        print(f"| {name} | {1e3 * pre:.2f} | {1e3 * dec:.3f} |")
    print(f"| ORT / torch | {ort_prefill / t_prefill:.2f}x | {ort_decode / t_decode:.2f}x |")
    agree = float((ort_tokens == t_tokens).mean())
    print(f"greedy tokens agree on {100 * agree:.1f}% of {ort_tokens.size} decode steps")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(args=vars(args), ort_prefill=ort_prefill, ort_decode=ort_decode,
                                                   torch_prefill=t_prefill, torch_decode=t_decode,
                                                   token_agreement=agree), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
