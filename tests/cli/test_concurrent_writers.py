"""Two runs writing the same output: the one that finishes second exits 2 with one line and leaves
the first one's output as it is, unless --overwrite (gdn_export.paths.publish_*). make-tiny races
for real in two processes; export and quantize find their output written by another run just
before their last step (the step itself is the real one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import gdn_export.onnx.export as export_module

REPO = Path(__file__).resolve().parents[2]


def _race(monkeypatch, module, name: str, appear) -> None:
    """module.name (its publish step) runs right after another run's output appeared: `appear()`."""
    real = getattr(module, name)

    def racing(*args, **kwargs):
        appear()
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, racing)


@pytest.mark.slow  # two processes that import torch: ~5 s of CPU
def test_two_make_tiny_runs_one_wins(tmp_path):
    target = tmp_path / "ckpt"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    runs = [subprocess.Popen([sys.executable, "-m", "gdn_export", "make-tiny", str(target), "--seed", str(seed)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
            for seed in (1, 2)]
    results = sorted(((r.wait(timeout=300), r.stdout.read(), r.stderr.read()) for r in runs), key=lambda x: x[0])
    (won, out, _), (lost, _, err) = results
    assert (won, lost) == (0, 2), results
    assert out.startswith("wrote qwen3_5 checkpoint to")
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gdn-export make-tiny: error: ") and \
        ("appeared while this command ran" in lines[0] or "exists and is not empty" in lines[0]), err
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary folder left


@pytest.mark.parametrize("overwrite", [False, True], ids=["kept", "overwrite"])
def test_export_keeps_a_file_that_appeared(cli, tmp_path, tiny_ckpt, tiny_onnx, monkeypatch, overwrite):
    """The trace is the session's export of the same checkpoint (what is tested is the last step)."""
    import onnx_ir

    out = tmp_path / "m.onnx"
    monkeypatch.setattr(export_module, "_trace", lambda model, specs, opset, **_: onnx_ir.load(tiny_onnx))
    _race(monkeypatch, export_module, "publish_files", lambda: out.write_bytes(b"another run's export"))
    r = cli("export", tiny_ckpt, "-o", out, "-q", *(["--overwrite"] if overwrite else []))
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
    if overwrite:
        assert r.code == 0 and out.read_bytes() != b"another run's export"
        return
    assert r.error_line("export") == (f"{out} appeared while this command ran (another run writing the same "
                                      f"output?); it is kept: pass --overwrite to replace it")
    assert out.read_bytes() == b"another run's export"


@pytest.mark.slow
def test_quantize_keeps_a_folder_that_appeared(cli, tmp_path, tiny_ckpt, monkeypatch):
    pytest.importorskip("modelopt")
    import gdn_export.quantize.writer as writer

    out = tmp_path / "q"

    def appear():
        out.mkdir()
        (out / "config.json").write_text("another run's checkpoint")

    _race(monkeypatch, writer, "publish_dir", appear)
    r = cli("quantize", tiny_ckpt, "-o", out, "--format", "int4-awq", "--calib-samples", 2, "--calib-seq-len", 8,
            "-q")
    assert "appeared while this command ran" in r.error_line("quantize")
    assert [p.name for p in out.iterdir()] == ["config.json"]
    assert (out / "config.json").read_text() == "another run's checkpoint"
    assert [p.name for p in tmp_path.iterdir()] == ["q"]
