"""What is live at the CUDA allocator's peak of a prefill (or of setup, or of a decode run): the
memory above weights + states, by the Python line that allocated it (issue 9's peak-memory target).

    python benchmarks/investigations/peak_memory_probe.py CHECKPOINT [--batch 1] [--prompt-len 4096] [--compile]
                                           [--phase prefill|setup|decode] [--out DIR]

Loads the checkpoint as `gdn-export bench` does (bf16, GraphRunner, triton ops), runs the phases once
untraced (compiles, capture), then records the allocator's history (torch.cuda.memory) over one run
of the chosen phase, replays its alloc / free events to find the peak, and groups the blocks live
there that were allocated during the phase by their innermost gdn_export (else torch) frame. Writes
peak_memory_probe.md / .json under --out (default $OUT, else a new temp folder) and prints the table.
(Frames come from the allocator's history: blocks that a CUDA graph's private pool holds were allocated at capture, in setup.)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/gpu_timing.py
from gpu_timing import save_table  # noqa: E402
from records import out_dir  # noqa: E402


def frame_of(frames) -> str:
    """The innermost frame in gdn_export (else the first Python frame), as file:line function."""
    py = [f for f in frames if f.get("filename", "").endswith(".py")]
    ours = [f for f in py if "gdn_export" in f["filename"] or "gdn_kernels" in f["filename"]]
    f = (ours or py or [{"filename": "?", "line": 0, "name": "?"}])[0]
    name = f["filename"].split("gdn_export/")[-1].split("gdn_kernels/")[-1].split("site-packages/")[-1]
    return f"{name}:{f['line']} {f['name']}"


def live_at_peak(snapshot) -> tuple[int, dict[int, tuple[int, str]], int]:
    """Replays the trace of device 0: (peak bytes allocated during the trace, the blocks live at the
    peak that the trace allocated {addr: (size, frame)}, their total)."""
    trace = snapshot["device_traces"][0]
    live: dict[int, tuple[int, str]] = {}
    cur = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for ev in trace:
        if ev["action"] == "alloc":
            live[ev["addr"]] = (ev["size"], frame_of(ev.get("frames", [])))
            cur += ev["size"]
            if cur > peak:
                peak, at_peak = cur, dict(live)
        elif ev["action"] == "free_completed" and ev["addr"] in live:
            cur -= live.pop(ev["addr"])[0]
    return peak, at_peak, sum(s for s, _ in at_peak.values())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=4096)
    p.add_argument("--op-backend", default="triton")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--phase", default="prefill", choices=["prefill", "setup", "decode"])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    args.out = out_dir(args.out, "peak_memory_probe")

    from gdn_export.layout import DeployLayout
    from gdn_export.runtime.bench import tensor_bytes
    from gdn_export.runtime.cuda_graph import GraphRunner
    from gdn_export.weights import load_checkpoint

    device = torch.device("cuda")
    B, T = args.batch, args.prompt_len
    model = load_checkpoint(args.checkpoint, dtype=torch.bfloat16, device=device)
    model.layout = DeployLayout.make(cache_len=T + 40)
    ids = torch.randint(0, model.config.vocab_size, (B, T), device=device)
    record = torch.cuda.memory._record_memory_history
    if args.phase == "setup":
        record(max_entries=1_000_000)
    runner = GraphRunner(model, device=device, op_backend=args.op_backend, compile=args.compile)
    states = runner.empty_states(B)
    weights, state_bytes = tensor_bytes(model.parameters()), tensor_bytes(states)

    def prefill():
        return runner.prefill_device(ids, runner.empty_states(B))

    def decode(logits, states):
        runner.decode_greedy(logits[:, -1].argmax(-1)[:, None], np.full(B, T, np.int64), states, 32)

    if args.phase != "setup":
        decode(*prefill())  # compiles, capture: untraced
        torch.cuda.synchronize()
        if args.phase == "prefill":
            record(max_entries=1_000_000)
            out = prefill()
        else:
            out = prefill()
            torch.cuda.synchronize()
            record(max_entries=1_000_000)
            decode(*out)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    record(enabled=None)
    peak, blocks, total = live_at_peak(snap)
    by_frame: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for size, frame in blocks.values():
        by_frame[frame][0] += 1
        by_frame[frame][1] += size
    rows = sorted(by_frame.items(), key=lambda kv: -kv[1][1])[:20]
    mib = 2 ** 20
    lines = [f"# Live at the {args.phase} peak: batch {B}, prompt {T}, {args.op_backend} ops, bf16"
             f"{', compiled' if args.compile else ''}", "",
             f"weights {weights / mib:.1f} MiB + states {state_bytes / mib:.1f} MiB; allocated during the "
             f"{args.phase} and live at its peak: {total / mib:.1f} MiB in {len(blocks)} blocks "
             f"(allocator max during it {torch.cuda.max_memory_allocated() / mib:.1f} MiB)", "",
             "| allocated at | blocks | MiB |", "|---|---|---|"]
    lines += [f"| `{frame}` | {n} | {size / mib:.1f} |" for frame, (n, size) in rows]
    result = {"phase": args.phase, "batch": B, "prompt_len": T, "weights_bytes": weights,
              "states_bytes": state_bytes, "live_at_peak_bytes": total, "trace_peak_bytes": peak,
              "by_frame": [{"frame": f, "blocks": n, "bytes": s} for f, (n, s) in rows]}
    save_table(args.out, "peak_memory_probe", result, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
