"""Logit drift of a bf16 / fp16 recurrent state against an fp32 state over long prompts and long
generations (issue 12, part 2).

    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/state_dtype_drift.py                 # tiny, CPU
    PYTHONPATH=$PWD:$PWD/kernels python3 benchmarks/state_dtype_drift.py --large --backend cuda

A random model (gdn_export.models.HybridForCausalLM, seeded init_tiny_weights): the tiny test
config on CPU, or with --large a 1.66B-class config (24 layers, 3 linear : 1 full attention, hidden
2048, Hk 16 / Hv 32, D 128, bf16 weights) on the GPU. One prompt of P random tokens is prefilled
in one call, then N tokens are decoded one step at a time, teacher-forced with the fp32-state
run's greedy tokens so that all runs see the same sequence. Each GatedDeltaNet layer gets its
recurrent state in the storage dtype under test (the model's state_specs are overridden here until
the model-level `state_dtype` plumbing lands); everything else is identical. Reported per window of
decode steps: relative RMS of the logits against the fp32-state run (mean and max over the window)
and the fraction of steps whose argmax agrees. Table printed last; JSON and markdown to $OUT.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

import gdn_export.models.hybrid as hybrid
from gdn_export.config import HybridConfig
from gdn_export.models import HybridForCausalLM
from gdn_export.ops import use_backend
from gdn_export.weights.tiny import init_tiny_weights, tiny_config_dict

STATES = {"bf16": torch.bfloat16, "fp16": torch.float16}
LARGE = dict(vocab_size=32000, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
             full_attention_interval=4, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
             linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
             linear_value_head_dim=128, max_position_embeddings=65536)


def build(large: bool, device: str, seed: int = 0) -> HybridForCausalLM:
    config = HybridConfig.from_dict(tiny_config_dict("qwen3_5", **(LARGE if large else {})))
    model = HybridForCausalLM(config).eval()
    init_tiny_weights(model, seed)
    model = model.to(device)
    return model.to(torch.bfloat16) if large else model


@contextlib.contextmanager
def state_dtype_override(model: HybridForCausalLM, state_dtype: torch.dtype):
    """Inside the block, `model` takes and returns `state_dtype` recurrent states: a stand-in for the
    model-level option (its state_specs and the fp32-only state check are swapped for the block)."""
    base = type(model).state_specs.__get__(model)
    model.state_specs = lambda: [dataclasses.replace(s, dtype=state_dtype) if s.kind == "recurrent" else s
                                 for s in base()]
    check = hybrid.check_states
    hybrid.check_states = lambda specs, states: None
    try:
        yield
    finally:
        hybrid.check_states = check
        del model.state_specs


@torch.no_grad()
def run(model, prompt, steps, tokens=None):
    """Prefill `prompt` [1, P] in one call, then decode `steps` tokens (teacher-forced with
    `tokens` when given, else greedy). Returns (prefill last logits, [steps, V] logits, tokens)."""
    device = prompt.device
    P = prompt.shape[1]
    states = model.empty_states(1, device)
    out = model(prompt, torch.arange(P, device=device)[None], *states)
    logits, states = out[0][:, -1], out[1:]
    prefill = logits.float().cpu()
    chosen, rows = [], []
    for t in range(steps):
        nxt = int(logits.argmax(-1)) if tokens is None else int(tokens[t])
        chosen.append(nxt)
        ids = torch.tensor([[nxt]], device=device)
        out = model(ids, torch.tensor([[P + t]], device=device), *states)
        logits, states = out[0][:, -1], out[1:]
        rows.append(logits.float().cpu())
    return prefill, torch.cat(rows), chosen


def rel_rms_rows(a, b):
    return ((a.double() - b.double()).norm(dim=-1) / b.double().norm(dim=-1)).float()


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
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = args.backend or ("cuda" if device == "cuda" else "reference")
    prompts = args.prompt or ([4096, 16384] if args.large else [64, 1024])
    steps = args.steps or (4000 if args.large else 2000)
    torch.manual_seed(args.seed)
    model = build(args.large, device, args.seed)
    V = model.config.vocab_size
    results = []
    with use_backend(backend):
        for P in prompts:
            prompt = torch.randint(0, V, (1, P), device=device)
            t0 = time.time()
            pre32, log32, tokens = run(model, prompt, steps)
            print(f"P={P}: fp32-state run {time.time() - t0:.0f} s", flush=True)
            for name, sd in STATES.items():
                with state_dtype_override(model, sd):
                    pre, logs, _ = run(model, prompt, steps, tokens)
                err = rel_rms_rows(logs, log32)
                agree = (logs.argmax(-1) == log32.argmax(-1)).float()
                row = dict(prompt=P, state=name, prefill_rel_rms=rel_rms_rows(pre, pre32).item(), windows=[])
                for a, b in windows(steps):
                    row["windows"].append(dict(steps=f"{a + 1}-{b}", mean=err[a:b].mean().item(),
                                               max=err[a:b].max().item(), argmax=agree[a:b].mean().item()))
                results.append(row)
                print(f"P={P} {name}: prefill {row['prefill_rel_rms']:.2e}, last window "
                      f"{row['windows'][-1]}", flush=True)
    what = "1.66B-class random model, bf16 weights" if args.large else "tiny random model (tests' config), fp32"
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
    tag = "large" if args.large else "tiny"
    (out / f"state_dtype_drift_{tag}.json").write_text(json.dumps(dict(backend=backend, results=results), indent=1))
    (out / f"state_dtype_drift_{tag}.md").write_text(table + "\n")
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
