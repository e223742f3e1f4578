"""Build plugins/ (libgdn_plugins.so + pluginHostTest) once per test session with the machine's
nvcc and cmake, against the TensorRT headers in ../shared/third_party/tensorrt/include.

Shared by tests/plugins and tests/trt (both conftests import `plugin_build`); the build itself is
cached per process, so it runs once however many conftests ask. A small architecture list keeps
CI fast; override with GDN_TEST_CUDA_ARCHS (e.g. "90"), or point GDN_TEST_PLUGIN_BUILD at an
existing build folder to skip building.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS_SRC = REPO / "plugins"
TRT_HEADERS = REPO.parent / "shared" / "third_party" / "tensorrt" / "include"
TEST_ARCHS = os.environ.get("GDN_TEST_CUDA_ARCHS", "80;90")


@dataclass(frozen=True)
class PluginBuild:
    folder: Path
    library: Path
    host_test: Path
    seconds: float


@functools.lru_cache(maxsize=None)
def _build() -> PluginBuild | str:
    """The build, or the reason it cannot be made here (a string)."""
    import time

    existing = os.environ.get("GDN_TEST_PLUGIN_BUILD")
    if existing:
        folder = Path(existing)
        return PluginBuild(folder, folder / "libgdn_plugins.so", folder / "pluginHostTest", 0.0)
    missing = [tool for tool in ("cmake", "nvcc") if shutil.which(tool) is None]
    if missing:
        return f"needs {' and '.join(missing)} on PATH to build plugins/"
    folder = Path(tempfile.mkdtemp(prefix="gdn-plugins-build-"))
    cmd = ["cmake", "-S", str(PLUGINS_SRC), "-B", str(folder), f"-DCMAKE_CUDA_ARCHITECTURES={TEST_ARCHS}",
           "-DCMAKE_BUILD_TYPE=Release"]
    if TRT_HEADERS.is_dir():
        cmd.append(f"-DTENSORRT_INCLUDE_DIR={TRT_HEADERS}")
    t0 = time.perf_counter()
    for step in (cmd, ["cmake", "--build", str(folder), "-j", str(os.cpu_count() or 2)]):
        proc = subprocess.run(step, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
            raise RuntimeError(f"{' '.join(step)} failed ({proc.returncode}):\n{tail}")
    return PluginBuild(folder, folder / "libgdn_plugins.so", folder / "pluginHostTest",
                       time.perf_counter() - t0)


@pytest.fixture(scope="session")
def plugin_build() -> PluginBuild:
    """libgdn_plugins.so and pluginHostTest built from this tree (skips without cmake / nvcc)."""
    result = _build()
    if isinstance(result, str):
        pytest.skip(result)
    return result
