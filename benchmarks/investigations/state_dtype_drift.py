"""Logit drift of a bf16 / fp16 recurrent state against an fp32 state over long prompts and long
generations (issue 12, part 2).

    PYTHONPATH=$PWD python3 benchmarks/investigations/state_dtype_drift.py                 # tiny, CPU
    PYTHONPATH=$PWD python3 benchmarks/investigations/state_dtype_drift.py --large --backend cuda

A random model (gdn_export.models.HybridForCausalLM, seeded init_tiny_weights): the tiny test
config on CPU (TorchRunner), or with --large a 1.66B-class config (24 layers, 3 linear : 1 full
attention, hidden 2048, Hk 16 / Hv 32, D 128, bf16 weights) on the GPU (GraphRunner: CUDA-graph
decode). The prompts (random tokens, one row each, ragged) are prefilled together, then N tokens
are decoded one step at a time, teacher-forced with the fp32-state run's greedy tokens so that all
runs see the same sequence. The runs differ only in the layout's `state_dtype` (what
`gdn-export export --state-dtype` sets). Reported per prompt and window of decode steps: relative
RMS of the logits against the fp32-state run (mean and max over the window) and the fraction of
steps whose argmax agrees. Table printed last; JSON and markdown to --out-dir
(default $OUT, else a new temp folder).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from gdn_export.hf_config import parse_config
from gdn_export.config import HybridConfig
from gdn_export.layout import DeployLayout
from gdn_export.models import HybridForCausalLM
from gdn_export.runtime.base import prefill
from gdn_export.weights.tiny import init_tiny_weights, tiny_config_dict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/records.py
from records import out_dir  # noqa: E402

STATES = {"bf16": torch.bfloat16, "fp16": torch.float16}
LARGE = dict(vocab_size=32000, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
             full_attention_interval=4, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
             linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
             linear_value_head_dim=128, max_position_embeddings=65536)


def build(large: bool, device: str, seed: int = 0, dtype: torch.dtype = torch.float32,
          **overrides) -> HybridForCausalLM:
    config = parse_config(tiny_config_dict("qwen3_5", **{**(LARGE if large else {}), **overrides}))
    model = HybridForCausalLM(config).eval()
    init_tiny_weights(model, seed)
    return model.to(device=device, dtype=dtype)


def make_runner(model, state_dtype, cache_len, device, backend):
    """A runner of `model` whose layout stores recurrent states in `state_dtype`."""
    model.layout = DeployLayout.make(cache_len=cache_len, state_dtype=state_dtype)
    if device == "cuda":
        from gdn_export.runtime.cuda_graph import GraphRunner

        return GraphRunner(model, device=device, op_backend=backend)
    from gdn_export.runtime.torch_runner import TorchRunner

    return TorchRunner(model, device=device, op_backend=backend)


@torch.no_grad()
def run(runner, prompts, steps, tokens=None):
    """Prefill the prompts (rows of any lengths), then decode `steps` tokens per row (teacher-forced
    with `tokens` [B, steps] when given, else greedy). Returns (prefill logits [B, V], [steps, B, V]
    logits, tokens [B, steps])."""
    lens = np.array([len(p) for p in prompts], np.int64)
    logits, states = prefill(runner, prompts, runner.empty_states(len(prompts)))
    first = logits[:, -1].copy()
    rows, chosen = [], []
    for t in range(steps):
        nxt = logits[:, -1].argmax(-1) if tokens is None else tokens[:, t]
        chosen.append(nxt)
        logits, states = runner.forward(nxt[:, None].astype(np.int64), lens + t, states)
        rows.append(logits[:, -1].copy())
    return first, np.stack(rows), np.stack(chosen, axis=1)


def rel_rms_rows(a, b):
    """Relative RMS of a against b along the last axis (float64)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


def windows(steps: int) -> list[tuple[int, int]]:
    edges = [0, 1, 10, 100, 1000, 2000, 4000, 8000, 16000]
    edges = [e for e in edges if e < steps] + [steps]
    return list(zip(edges[:-1], edges[1:]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large", action="store_true", help="the 1.66B-class random model (GPU)")
    ap.add_argument("--backend", default=None, help="gdn backend (default: reference on CPU, cuda on GPU)")
    ap.add_argument("--prompt", type=int, nargs="+", default=None, help="prompt lengths")
    ap.add_argument("--steps", type=int, default=None, help="decode steps after each prompt")
    ap.add_argument("--layers", type=int, default=None, help="override the layer count (3:1 kept)")
    ap.add_argument("--vocab", type=int, default=None, help="override the vocabulary size")
    ap.add_argument("--model-dtype", choices=("fp32", "bf16"), default=None,
                    help="weights and activations (default: bf16 with --large, else fp32). With fp32, a "
                    "bf16 copy of the model with an fp32 state runs too: the activation-precision floor")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    args.out_dir = out_dir(args.out_dir, "state_dtype_drift")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = args.backend or ("cuda" if device == "cuda" else "reference")
    prompts = args.prompt or ([4096, 16384] if args.large else [64, 1024])
    steps = args.steps or (4000 if args.large else 2000)
    torch.manual_seed(args.seed)
    model_dtype = args.model_dtype or ("bf16" if args.large else "fp32")
    overrides = {k: v for k, v in (("num_hidden_layers", args.layers), ("vocab_size", args.vocab)) if v}
    model = build(args.large, device, args.seed,
                  torch.bfloat16 if model_dtype == "bf16" else torch.float32, **overrides)
    V = model.config.vocab_size
    rng = np.random.default_rng(args.seed)
    rows = [rng.integers(0, V, P) for P in prompts]
    cache_len = max(prompts) + steps + 1
    t0 = time.time()
    runner = make_runner(model, torch.float32, cache_len, device, backend)
    pre32, log32, tokens = run(runner, rows, steps)
    del runner
    print(f"fp32-state run: {time.time() - t0:.0f} s", flush=True)
    results = []
    runs = [(name, model, sd) for name, sd in STATES.items()]
    if model_dtype == "fp32":
        # The same model in bf16 with an fp32 state: how far bf16 activations alone move the logits
        # (the scale that validate's bf16 tolerances already accept).
        runs.append(("fp32, bf16 model", build(args.large, device, args.seed, torch.bfloat16, **overrides),
                     torch.float32))
    for name, m, sd in runs:
        runner = make_runner(m, sd, cache_len, device, backend)
        pre, logs, _ = run(runner, rows, steps, tokens)
        del runner
        for b, P in enumerate(prompts):
            err = rel_rms_rows(logs[:, b], log32[:, b])
            agree = (logs[:, b].argmax(-1) == log32[:, b].argmax(-1)).astype(np.float64)
            row = dict(prompt=P, state=name, prefill_rel_rms=float(rel_rms_rows(pre[b], pre32[b])), windows=[])
            for a, e in windows(steps):
                row["windows"].append(dict(steps=f"{a + 1}-{e}", mean=float(err[a:e].mean()),
                                           max=float(err[a:e].max()), argmax=float(agree[a:e].mean())))
            results.append(row)
            print(f"P={P} {name}: prefill {row['prefill_rel_rms']:.2e}, last window "
                  f"{row['windows'][-1]}", flush=True)
    size = "1.66B-class random model" if args.large else "tiny random model (tests' config)"
    if overrides:
        size += " with " + ", ".join(f"{k}={v}" for k, v in overrides.items())
    what = f"{size}, {model_dtype} weights and activations"
    lines = [f"{what}, backend {backend} on {device}; logits rel. RMS vs the fp32-state run "
             "(mean / max over the window) and argmax agreement.", "",
             "| prompt | state | after prefill | decode steps | mean | max | argmax agree |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        for i, w in enumerate(r["windows"]):
            pre = f"{r['prefill_rel_rms']:.1e}" if i == 0 else ""
            lines.append(f"| {r['prompt'] if i == 0 else ''} | {r['state'] if i == 0 else ''} | {pre} | "
                         f"{w['steps']} | {w['mean']:.1e} | {w['max']:.1e} | {w['argmax']:.1%} |")
    table = "\n".join(lines)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tag = ("large" if args.large else "tiny") + (f"_{model_dtype}" if args.model_dtype else "")
    (out / f"state_dtype_drift_{tag}.json").write_text(json.dumps(dict(backend=backend, results=results), indent=1))
    (out / f"state_dtype_drift_{tag}.md").write_text(table + "\n")
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
