"""libgdn_plugins.so as built by plugins/CMakeLists.txt: what it exports and links, and the
plugin host test's interface pass (no GPU needed) or full pass (GPU)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch


def _dynamic(lib, *args) -> str:
    return subprocess.run(["readelf", *args, str(lib)], capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs readelf (binutils)")
def test_library_exports_only_the_loader_entry_points(plugin_build):
    symbols = _dynamic(plugin_build.library, "--dyn-syms", "-W")
    exported = set()
    for line in symbols.splitlines():
        cols = line.split()
        # Num: Value Size Type Bind Vis Ndx Name: defined (Ndx != UND), global, default visibility.
        if len(cols) >= 8 and cols[4] == "GLOBAL" and cols[5] == "DEFAULT" and cols[6] != "UND" and cols[3] == "FUNC":
            exported.add(cols[7].split("@")[0])
    assert {"getCreators", "setLoggerFinder"} <= exported
    assert exported <= {"getCreators", "setLoggerFinder", "_init", "_fini"}, sorted(exported)


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs readelf (binutils)")
def test_library_links_neither_tensorrt_nor_shared_cudart(plugin_build):
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _dynamic(plugin_build.library, "-d"))
    assert needed, "no NEEDED entries parsed"
    bad = [n for n in needed if n.startswith(("libnvinfer", "libtensorrt", "libcudart"))]
    assert not bad, f"libgdn_plugins.so must not link {bad} (needs: {needed})"


def test_host_test_interface_calls_without_gpu(plugin_build):
    """Every plugin call before enqueue, over the whole shape grid, plus the error cases."""
    proc = subprocess.run([str(plugin_build.host_test), "--no-gpu"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "ALL PASSED" in proc.stdout
    assert proc.stdout.count("| GatedDeltaRule |") >= 144 and proc.stdout.count("| CausalConv1d |") >= 48
    for case in ("without use_qk_l2norm", "with an int32 scale", "CausalConv1d without fields",
                 "GatedDeltaRule getFieldNames"):
        assert re.search(rf"\| [^|]*{re.escape(case)}[^|]* \| PASS \|", proc.stdout), case


def test_host_test_refuses_to_run_without_gpu_unless_asked(plugin_build):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the full run is test_host_test_quick_on_gpu")
    proc = subprocess.run([str(plugin_build.host_test), "--quick"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "no CUDA device" in proc.stderr


@pytest.mark.gpu
def test_host_test_quick_on_gpu(plugin_build):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none found)")
    proc = subprocess.run([str(plugin_build.host_test), "--quick"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_build_has_no_compiler_warnings(plugin_build):
    """nvcc and the C++ compiler (-Wall -Wextra) stay silent for the built architectures (sm_80
    without a GPU: tests/kernels/test_cuda_compile.py then leaves the plugin sources to this build)."""
    from tests.plugins.cmake_build import BUILD_LOG

    log = plugin_build.folder / BUILD_LOG
    if not log.is_file():
        pytest.skip(f"{plugin_build.folder} was built outside the test suite (no {BUILD_LOG})")
    warnings = [line for line in log.read_text().splitlines() if "warning" in line.lower()]
    assert not warnings, "\n".join(warnings[:20])
