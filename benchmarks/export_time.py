"""Wall time and peak RSS of `gdn-export export` end to end (CPU): cold trace cache, warm trace cache
and the whole-model trace, on a 4-layer and a 60-layer checkpoint.

    python benchmarks/export_time.py [--family qwen3_5] [--layers 4,60] [--repeat 1] [--out DIR]

Both checkpoints are `make-tiny` ones of the family (make_tiny_checkpoint: hidden size 64, vocab
256, its layer pattern; the 60-layer one has those tiny sizes too, so that the time is the
tracing's and the graph's rather than the weights': 10 MB), written into the records folder. Each export runs as a child process: `cold` with an empty trace cache of
its own (it traces one layer of each kind and stamps), `warm` again with the cache `cold` filled (it
traces nothing), `whole` with `--whole-trace` (every layer traced). Wall time is the child's, from
start to exit, with Python's startup and imports; peak RSS its ru_maxrss. The table goes to stdout
and, with each child's progress lines, to the records folder (benchmarks/records.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from records import out_dir

ROOT = Path(__file__).resolve().parent.parent
MODES = ("cold", "warm", "whole")


def _run(argv: list[str], env: dict, log: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS GB) of one child; its stdout and stderr appended to `log`."""
    with open(log, "ab") as f:
        f.write(f"$ {' '.join(argv)}\n".encode())
        f.flush()
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}; see {log}")
    return wall, usage.ru_maxrss * 1024 / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="qwen3_5")
    ap.add_argument("--layers", default="4,60", help="comma-separated layer counts (default 4,60)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each mode; the table shows the fastest")
    ap.add_argument("--out", default=None, help="records folder (default $OUT, else a new temp folder)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from gdn_export.weights import make_tiny_checkpoint

    out = out_dir(args.out, "export-time")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    python = [sys.executable, "-m", "gdn_export"]
    log = out / "export_time.log"
    rows = []
    for n in (int(x) for x in args.layers.split(",")):
        ckpt = make_tiny_checkpoint(out / f"{args.family}-{n}", family=args.family, seed=0, num_hidden_layers=n,
                                    overwrite=True)
        size = sum(p.stat().st_size for p in ckpt.iterdir()) / 1e6
        cache = out / f"trace-cache-{n}"
        shutil.rmtree(cache, ignore_errors=True)
        for mode in MODES:
            best = None
            for r in range(args.repeat):
                if mode == "cold":
                    shutil.rmtree(cache, ignore_errors=True)
                flags = ["--whole-trace"] if mode == "whole" else []
                result = _run([*python, "export", str(ckpt), "-o", str(out / f"{n}-{mode}.onnx"), "--overwrite",
                               *flags], dict(env, GDN_EXPORT_CACHE=str(cache)), log)
                best = result if best is None or result[0] < best[0] else best
            rows.append({"layers": n, "checkpoint_mb": round(size, 1), "mode": mode,
                         "wall_s": round(best[0], 2), "peak_rss_gb": round(best[1], 3)})
            print(f"{n} layers, {mode}: {best[0]:.2f} s, {best[1]:.3f} GB", file=sys.stderr, flush=True)
    (out / "export_time.json").write_text(json.dumps(rows, indent=1))
    lines = ["| layers | checkpoint | mode | wall | peak RSS |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['layers']} | {r['checkpoint_mb']} MB | {r['mode']} | {r['wall_s']:.1f} s | "
                     f"{r['peak_rss_gb']:.2f} GB |")
    table = "\n".join(lines)
    (out / "export_time.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
