"""benchmarks/ort_cpu_kernels.py runs on a tiny model; benchmarks/ort_gpu_bench.py and ort_gpu_forms.py
parse their flags and stop with one line where onnxruntime-gpu is missing (they run on the GPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import onnxruntime
import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


@pytest.mark.slow
def test_ort_cpu_kernels_tiny(tmp_path):
    out = subprocess.run([sys.executable, ROOT / "benchmarks/ort_cpu_kernels.py", "--hidden", "128", "--layers", "2",
                          "--prompt", "8", "--steps", "2", "--json", tmp_path / "r.json"],
                         env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert [r["kernels"] for r in rows] == ["native", "functions"]
    assert all(r["prefill_ms"] > 0 and r["decode_ms"] > 0 for r in rows)
    assert "| functions / native |" in out.stdout


def test_ort_gpu_bench_help():
    out = subprocess.run([sys.executable, ROOT / "benchmarks/ort_gpu_bench.py", "--help"], env=ENV,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--onnx-ops" in out.stdout


@pytest.mark.skipif("CUDAExecutionProvider" in onnxruntime.get_available_providers(),
                    reason="onnxruntime-gpu is installed")
def test_ort_gpu_bench_without_onnxruntime_gpu_is_one_error(tmp_path):
    from gdn_export.weights import make_tiny_checkpoint

    ckpt = make_tiny_checkpoint(tmp_path / "ckpt", "qwen3_5")
    out = subprocess.run([sys.executable, ROOT / "benchmarks/ort_gpu_bench.py", ckpt, "--dtype", "fp32",
                          "--prompt", "4", "--steps", "1"], env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode != 0 and "needs onnxruntime-gpu" in out.stderr.strip().splitlines()[-1]


@pytest.mark.skipif("CUDAExecutionProvider" in onnxruntime.get_available_providers(),
                    reason="onnxruntime-gpu is installed")
def test_ort_gpu_forms_without_onnxruntime_gpu_is_one_error_before_any_work(tmp_path):
    """benchmarks/ort_gpu_forms.py (run on a GPU; `--dry-run` runs its steps tiny on the CPU)."""
    out = subprocess.run([sys.executable, ROOT / "benchmarks/ort_gpu_forms.py", "--out", tmp_path / "o"], env=ENV,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "needs onnxruntime-gpu" in out.stderr
    assert not (tmp_path / "o").exists()
