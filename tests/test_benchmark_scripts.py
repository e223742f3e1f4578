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
    out = subprocess.run([sys.executable, ROOT / "benchmarks/investigations/state_dtype_drift.py", "--prompt", "9", "23",
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
    sys.path.insert(0, str(ROOT / "benchmarks" / "investigations"))
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


def test_sass_phases_splits_at_barriers():
    """sass_phases.phases on a synthetic cuobjdump listing: predicated instructions count under their
    opcode, and every BAR closes a phase (the disassembly itself needs nvcc and cuobjdump)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "investigations"))
    try:
        from sass_phases import phases
    finally:
        sys.path.pop(0)
    sass = "\n".join([
        "        Function : _Z6kernelv",
        "        /*0000*/                   LDC R1, c[0x0][0x28] ;            /* 0x00000a00ff017b82 */",
        "        /*0010*/               @P0 LDS.64 R2, [R4] ;",
        "        /*0020*/                   HMMA.16816.F32.BF16 R8, R12, R16, R8 ;",
        "        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;",
        "        /*0040*/              @!P1 FFMA R2, R3, R4, R2 ;",
        "        /*10050*/                  FFMA R2, R3, R4, R2 ;",
        "        /*10060*/                  EXIT ;",
    ])
    rows = phases(sass)
    assert [addr for addr, _ in rows] == ["0030", "end"]
    assert rows[0][1] == {"LDC": 1, "LDS": 1, "HMMA": 1, "BAR": 1}
    assert rows[1][1] == {"FFMA": 2, "EXIT": 1}
