"""The CPU-runnable benchmark scripts run on the current model contract (a script that drifted from
it would only fail on the device)."""

import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_state_dtype_drift_tiny(tmp_path):
    """Without --out-dir or $OUT, the records go to a new folder in the temp dir, which the script
    names on stderr; nothing is written where it runs."""
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env.update(PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'kernels'}", TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "cwd").mkdir()
    out = subprocess.run([sys.executable, ROOT / "benchmarks/investigations/state_dtype_drift.py", "--prompt", "9", "23",
                          "--steps", "12"], env=env, cwd=tmp_path / "cwd", capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not any((tmp_path / "cwd").iterdir())
    (records,) = (tmp_path / "tmp").glob("gdn-state_dtype_drift.*")
    assert f"records go to {records}" in out.stderr
    results = json.loads((records / "state_dtype_drift_tiny.json").read_text())["results"]
    floor = "fp32, bf16 model"  # fp32 state, bf16 weights and activations
    assert sorted((r["prompt"], r["state"]) for r in results) == sorted(
        (P, s) for P in (9, 23) for s in ("bf16", "fp16", floor))
    drift = {(r["prompt"], r["state"]): r["windows"][-1]["mean"] for r in results}
    for P in (9, 23):
        # a rounded state moves the logits, fp16 (11-bit mantissa) less than bf16 (8-bit), and both
        # less than bf16 activations do
        assert 0 < drift[P, "fp16"] < drift[P, "bf16"] < drift[P, floor] < 0.1, drift
    assert "| prompt | state |" in (records / "state_dtype_drift_tiny.md").read_text()


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


def test_records_go_outside_the_repository_by_default(tmp_path, monkeypatch):
    """records.out_dir: the folder given, else $OUT, else a new temp folder; and no benchmark script
    defaults an output option (--out, --out-dir, --json, ...) to a path, which would resolve inside
    the tree when run from the repository root as documented."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from records import out_dir
    finally:
        sys.path.pop(0)
    monkeypatch.setenv("OUT", str(tmp_path / "env"))
    assert out_dir(tmp_path / "given", "x") == tmp_path / "given" and (tmp_path / "given").is_dir()
    assert out_dir(None, "x") == tmp_path / "env" and (tmp_path / "env").is_dir()
    monkeypatch.delenv("OUT")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = out_dir(None, "x")
    assert made.parent == tmp_path and made.name.startswith("gdn-x.")

    offenders = []
    for script in sorted((ROOT / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"):
                continue
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if not any(n.startswith(("--out", "--json")) or n == "--keep" for n in names):
                continue
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            if default is not None and not (isinstance(default, ast.Constant) and default.value is None):
                offenders.append(f"{script.relative_to(ROOT)}:{node.lineno} {names[0]}")
    assert not offenders, offenders


def test_every_tool_is_in_the_readme_and_every_shell_script_parses():
    """benchmarks/README.md names every script of benchmarks/ and benchmarks/investigations/ (the index a
    newcomer reads first), and every shell script there passes `bash -n`."""
    readme = (ROOT / "benchmarks/README.md").read_text()
    scripts = sorted([*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "benchmarks").glob("*.sh"),
                      *(ROOT / "benchmarks/investigations").glob("*.py")])
    missing = [s.name for s in scripts if f"`{s.name}" not in readme and s.name != "__init__.py"]
    assert not missing, f"not in benchmarks/README.md: {missing}"
    for script in (ROOT / "benchmarks").glob("*.sh"):
        out = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
        assert out.returncode == 0, f"{script.name}: {out.stderr}"
