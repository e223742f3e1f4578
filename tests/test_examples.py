"""The samples run (the documentation's command lines: tests/test_docs.py)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env():
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_python_api_sample(tmp_path):
    out = subprocess.run([sys.executable, ROOT / "samples/python_api.py", tmp_path], env=_env(),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "torch tokens" in out.stdout and "ort   tokens" in out.stdout


def test_shell_sample(tmp_path):
    out = subprocess.run(["bash", ROOT / "samples/export_and_validate.sh", tmp_path], env=_env(),
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "PASS" in out.stdout
    assert (tmp_path / "report.json").is_file() and (tmp_path / "ort.npz").is_file()
