"""CPU-only: the kernel sources compile with nvcc for sm_80 and sm_90 (skipped without nvcc).

CI has no GPU, so this is what catches a kernel that no longer builds for the TensorRT plugins.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
SOURCES = [
    PLUGINS / "gatedDeltaRulePlugin" / "gatedDeltaRuleKernels.cu",
    PLUGINS / "causalConv1dPlugin" / "causalConv1dKernels.cu",
    PLUGINS / "moePlugin" / "moeKernels.cu",
    # the decode16 tile study (a device-only benchmark): it instantiates tiles the launcher does not
    PLUGINS.parent / "benchmarks" / "investigations" / "cuda" / "decode16_tiles.cu",
]
ARCHS = ["80", "90"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found on PATH"),
]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_nvcc_compiles(source, tmp_path):
    gencodes = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]
    cmd = ["nvcc", "-std=c++17", "-O3", "--expt-relaxed-constexpr", "--threads", "2", *gencodes,
           "-I", str(PLUGINS), "-c", str(source), "-o", str(tmp_path / "out.o")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"nvcc failed for {source.name}:\n{result.stderr[-4000:]}"
    assert "warning" not in result.stderr.lower(), f"nvcc warned for {source.name}:\n{result.stderr[-4000:]}"
