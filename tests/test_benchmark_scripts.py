"""The CPU-runnable benchmark scripts run on the current model contract (a script that drifted from
it would only fail on the device)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_state_dtype_drift_tiny(tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'kernels'}")
    out = subprocess.run([sys.executable, ROOT / "benchmarks/state_dtype_drift.py", "--prompt", "9", "23",
                          "--steps", "12", "--out-dir", tmp_path], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads((tmp_path / "state_dtype_drift_tiny.json").read_text())["results"]
    floor = "fp32, bf16 model"  # fp32 state, bf16 weights and activations
    assert sorted((r["prompt"], r["state"]) for r in results) == sorted(
        (P, s) for P in (9, 23) for s in ("bf16", "fp16", floor))
    drift = {(r["prompt"], r["state"]): r["windows"][-1]["mean"] for r in results}
    for P in (9, 23):
        # a rounded state moves the logits, fp16 (11-bit mantissa) less than bf16 (8-bit), and both
        # less than bf16 activations do
        assert 0 < drift[P, "fp16"] < drift[P, "bf16"] < drift[P, floor] < 0.1, drift
    assert "| prompt | state |" in (tmp_path / "state_dtype_drift_tiny.md").read_text()


def test_peak_memory_probe_replays_the_allocator_trace():
    """peak_memory_probe.live_at_peak on a synthetic allocator history: the blocks live at the peak,
    grouped by their innermost gdn_export frame (the probe itself needs a GPU)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from peak_memory_probe import frame_of, live_at_peak
    finally:
        sys.path.pop(0)
    ours = [{"filename": "/x/torch/nn/functional.py", "line": 3, "name": "linear"},
            {"filename": "/x/gdn_export/modules/mlp.py", "line": 41, "name": "forward"}]
    ev = [("alloc", 1, 100, ours), ("alloc", 2, 50, []), ("free_completed", 1, 100, []),
          ("alloc", 3, 120, ours), ("alloc", 4, 10, ours), ("free_completed", 4, 10, []),
          ("alloc", 5, 5, [])]
    snap = {"device_traces": [[{"action": a, "addr": addr, "size": s, "frames": f} for a, addr, s, f in ev]]}
    peak, blocks, total = live_at_peak(snap)
    assert peak == 180 and total == 180 and set(blocks) == {2, 3, 4}
    assert frame_of(ours) == "modules/mlp.py:41 forward"
    assert frame_of([]) == "?:0 ?"
