"""CPU-only: the kernel sources compile with nvcc, without a warning (skipped without nvcc).

CI has no GPU, so this is what catches a kernel that no longer builds for the TensorRT plugins. The
plugin sources are compiled by the plugin library the suite builds anyway (tests/plugins/cmake_build.py:
sm_80 on a machine without a GPU, the GPU's architecture on one; tests/plugins/test_plugin_library.py
checks its log for warnings), so here they compile for sm_80 only where that build cannot be made (no
TensorRT headers): the gated-delta-rule kernels are not compiled twice. The decode16
tile study is in no build: it compiles here for sm_80 and sm_90, with the plugin test build's
device-code flags (unoptimized without a GPU: tests/plugins/cmake_build.py).
"""

import shutil
import subprocess
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
PLUGIN_ARCHS = ["80"]
SOURCES = [
    pytest.param(KERNELS / "gated_delta_rule" / "cuda" / "gatedDeltaRuleKernels.cu", PLUGIN_ARCHS,
                 id="gatedDeltaRuleKernels.cu"),
    pytest.param(KERNELS / "causal_conv1d" / "cuda" / "causalConv1dKernels.cu", PLUGIN_ARCHS,
                 id="causalConv1dKernels.cu"),
    pytest.param(KERNELS / "moe" / "cuda" / "moeKernels.cu", PLUGIN_ARCHS, id="moeKernels.cu"),
    # the decode16 tile study (a device-only benchmark): it instantiates tiles the launcher does not
    pytest.param(KERNELS.parent / "benchmarks" / "investigations" / "cuda" / "decode16_tiles.cu",
                 ["80", "90"], id="decode16_tiles.cu"),
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found on PATH"),
]


@pytest.mark.parametrize("source,archs", SOURCES)
def test_nvcc_compiles(source, archs, tmp_path):
    if source.is_relative_to(KERNELS):
        from tests.plugins.cmake_build import TEST_ARCHS, _why_not

        if _why_not() is None and "80" in TEST_ARCHS.split(";"):
            pytest.skip("compiled for sm_80 without a warning by the plugin library build (tests/plugins)")
    from tests.plugins.cmake_build import TEST_CUDA_FLAGS  # unoptimized device code without a GPU

    gencodes = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    cmd = ["nvcc", "-std=c++17", "-O3", *TEST_CUDA_FLAGS.split(), "--expt-relaxed-constexpr", "--threads", "2",
           *gencodes, "-I", str(KERNELS), "-c", str(source), "-o", str(tmp_path / "out.o")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"nvcc failed for {source.name}:\n{result.stderr[-4000:]}"
    assert "warning" not in result.stderr.lower(), f"nvcc warned for {source.name}:\n{result.stderr[-4000:]}"
