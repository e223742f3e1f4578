"""ONNX Runtime CPU: the GDN layers on the native com.microsoft kernels vs the function bodies (or vs
the ort form's GatedDeltaNet kernels).

    python benchmarks/ort_cpu_kernels.py [--hidden 512] [--layers 8] [--prompt 256] [--steps 32]
        [--threads 2] [--onnx-ops gdn|standard|ort] [--json out.json]

Writes a random Qwen3.5 text checkpoint (gdn_export.weights.make_tiny_checkpoint with the given
sizes: 3 GDN : 1 attention layers, GDN heads Hk = hidden / 128, Hv = 2 Hk of Dk = Dv = 128), exports
it (fp32) in a temporary folder, opens it twice in OrtRunner (kernels="native" and "functions") and
times on the same inputs: a prefill of one row of --prompt tokens (median of 3) and the decode step
(median over --steps greedy steps after it). With --onnx-ops ort the two rows are the gdn file on the
LinearAttention kernels ("native") and its ort form (GatedDeltaNet, "ort"; docs/onnx_forms.md).
Prints a Markdown table; the CPU's 1-minute load average before and after is printed too (a shared
machine skews the absolute times, not much the ratio of runs taken side by side).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def _time_prefill(runner, ids, repeats=3):
    times = []
    for _ in range(repeats):
        states = runner.empty_states(1)
        t0 = time.perf_counter()
        logits, states = runner.forward(ids, 0, states)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), logits, states


def _time_decode(runner, logits, states, past, steps):
    times = []
    token = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
    for i in range(steps):
        t0 = time.perf_counter()
        logits, states = runner.forward(token, past + i, states)
        times.append(time.perf_counter() - t0)
        token = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
    return statistics.median(times)


def main(argv=None) -> int:
    import onnxruntime as ort
    import torch

    from gdn_export.layout import DeployLayout
    from gdn_export.onnx import export_onnx
    from gdn_export.runtime.ort_runner import OrtRunner
    from gdn_export.weights import load_checkpoint, make_tiny_checkpoint

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--onnx-ops", choices=("gdn", "standard", "ort"), default="gdn")
    p.add_argument("--json")
    args = p.parse_args(argv)
    hk = max(args.hidden // 128, 1)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_tiny_checkpoint(Path(tmp) / "ckpt", "qwen3_5", seed=0, hidden_size=args.hidden,
                                    intermediate_size=3 * args.hidden, num_hidden_layers=args.layers,
                                    linear_num_key_heads=hk, linear_num_value_heads=2 * hk,
                                    linear_key_head_dim=128, linear_value_head_dim=128,
                                    num_attention_heads=max(args.hidden // 128, 1), num_key_value_heads=1,
                                    head_dim=128, vocab_size=4096)
        model = load_checkpoint(ckpt, dtype=torch.float32)
        model.layout = DeployLayout.make(cache_len=args.prompt + args.steps + 1)
        path = export_onnx(model, Path(tmp) / "m.onnx", onnx_ops="gdn" if args.onnx_ops == "ort" else args.onnx_ops)
        runs = [("native", path, "native"), ("functions", path, "functions")]
        if args.onnx_ops == "ort":
            from gdn_export.onnx.export import rewrite_form

            ort_path = Path(tmp) / "m-ort.onnx"
            shutil.copyfile(path, ort_path)
            rewrite_form(ort_path, "ort")
            runs = [("native", path, "native"), ("ort", ort_path, "native")]
        ids = np.random.default_rng(0).integers(0, 4096, (1, args.prompt), dtype=np.int64)
        rows = []
        load_before = os.getloadavg()[0]
        for name, file, kernels in runs:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = args.threads
            runner = OrtRunner(file, kernels=kernels, session_options=opts)
            runner.forward(ids[:, :8], 0, runner.empty_states(1))  # warm up
            prefill, logits, states = _time_prefill(runner, ids)
            decode = _time_decode(runner, logits, states, args.prompt, args.steps)
            rows.append(dict(kernels=name, note=runner.kernels_note, prefill_ms=1e3 * prefill,
                             decode_ms=1e3 * decode))
        load_after = os.getloadavg()[0]
    native, body = rows
    print(f"| ORT {ort.__version__} CPU, {args.threads} threads, {args.onnx_ops} file | prefill {args.prompt} "
          f"tokens (ms) | decode step (ms) |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['kernels']} | {r['prefill_ms']:.1f} | {r['decode_ms']:.2f} |")
    print(f"| {body['kernels']} / native | {body['prefill_ms'] / native['prefill_ms']:.2f}x | "
          f"{body['decode_ms'] / native['decode_ms']:.2f}x |")
    print(f"load average (1 min): {load_before:.2f} before, {load_after:.2f} after")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(args=vars(args), rows=rows, load=[load_before, load_after]),
                                              indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
