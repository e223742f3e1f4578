"""A long stream on a tiny model with a streaming export layout: memory stays flat.

    python benchmarks/stream_memory.py [--steps 30000] [--sinks 4] [--window 16]

Decodes `--steps` greedy tokens for two rows through the PyTorch model with an S + W slot cache and
prints the process RSS every 5000 steps, the cache's size, and that every state is still the tensor
it started as (updated in place; nothing grows). CPU; a 2-core machine does ~100 steps/s.
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from gdn_export.hf_config import parse_config
from gdn_export.config import HybridConfig
from gdn_export.layout import DeployLayout
from gdn_export.models import HybridForCausalLM
from gdn_export.weights.tiny import init_tiny_weights, tiny_config_dict


def rss_mib() -> float:
    """Current resident set size in MiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30000)
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--window", type=int, default=16)
    args = ap.parse_args(argv)
    cfg = parse_config(tiny_config_dict("qwen3_5"))
    model = HybridForCausalLM(cfg, DeployLayout.make(sinks=args.sinks, window=args.window)).eval()
    init_tiny_weights(model, 0)
    model.check_inputs = False  # checked once below; the loop is the steady state a server runs
    states = model.empty_states(2)
    kv = [i for i, spec in enumerate(model.state_specs()) if spec.kind in ("key", "value")]
    first = [states[i].data_ptr() for i in kv]
    tok = torch.tensor([[1], [2]])
    past, ones = torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.long)
    print(f"cache: {tuple(states[kv[0]].shape)} per K / V (sinks {args.sinks} + window {args.window})")
    t0 = time.time()
    with torch.no_grad():
        for step in range(1, args.steps + 1):
            logits, *states = model(tok, past, ones, *states)
            tok = logits[:, -1].argmax(-1, keepdim=True)
            past += 1
            if step % 5000 == 0 or step == 1000:
                same = [states[i].data_ptr() for i in kv] == first
                print(f"step {step:6d}  position {int(past[0]):6d}  rss {rss_mib():7.1f} MiB  "
                      f"K/V updated in place: {same}  {time.time() - t0:6.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
