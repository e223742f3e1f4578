"""GPU timing helpers shared by the benchmark scripts (run them as `python3 benchmarks/<script>.py`,
which puts this folder on sys.path).

    median_ms(fn)        do_bench's median (it flushes L2 between calls), ms
    graph_ms(fn, steps)  GPU time per call, replayed from a CUDA graph of `steps` calls (launch gaps
                         out of the number); `fallback` times without the graph when capture fails
    copy_tbps()          device-to-device copy bandwidth of 2 GiB, TB/s counting read + write
    save_table(...)      write a benchmark's markdown table and JSON to a folder, print the table
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from triton.testing import do_bench


def median_ms(fn, warmup=25, rep=200) -> float:
    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def graph_ms(fn, steps: int = 20, fallback=None) -> float:
    """fn's GPU time per call from the replay of a graph of `steps` calls (3 warm-up calls on a side
    stream first). `fallback(fn)` is timed instead when the capture fails (the reason is printed);
    without one the error propagates."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(steps):
                fn()
    except Exception as exc:  # noqa: BLE001  (timing falls back; the reason is printed)
        if fallback is None:
            raise
        print(f"  (graph capture failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}; events)")
        torch.cuda.synchronize()
        return fallback(fn)
    return median_ms(graph.replay) / steps


def copy_tbps() -> float:
    """TB/s of a 2 GiB device-to-device copy, counting the bytes read and written."""
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), warmup=5, rep=100)
    return 2 * src.numel() / ms / 1e9


def save_table(out_dir, stem: str, data, table: str) -> None:
    """OUT_DIR/stem.json (data) and OUT_DIR/stem.md (table), then the table on stdout, last."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1))
    (out / f"{stem}.md").write_text(table + "\n")
    print()
    print(table)
