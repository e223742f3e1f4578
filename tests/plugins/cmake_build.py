"""Build plugins/ (libgdn_plugins.so + pluginHostTest) once per test session with the machine's
nvcc and cmake, against TensorRT headers found by `find_tensorrt_headers` (in this order: env
TENSORRT_INCLUDE_DIR, env TENSORRT_ROOT/include, the repository's ../shared/third_party/tensorrt/
include, the usual install folders). Without headers, cmake or nvcc every test that needs the build
skips with the reason; a cmake or compiler failure with all three present is an error.

Shared by tests/plugins and tests/trt (both conftests import `plugin_build`); the build itself is
cached per process, so it runs once however many conftests ask, and under pytest-xdist once per run:
the first worker builds into a folder named by the run's id while the others wait on its lock. A small architecture list keeps
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
SHARED_TRT_HEADERS = REPO.parent / "shared" / "third_party" / "tensorrt" / "include"
# The folders plugins/CMakeLists.txt also searches last.
SYSTEM_TRT_HEADERS = (Path("/usr/include/x86_64-linux-gnu"), Path("/usr/include/aarch64-linux-gnu"),
                      Path("/usr/local/tensorrt/include"), Path("/opt/tensorrt/include"))
HEADER = "NvInferRuntime.h"
TEST_ARCHS = os.environ.get("GDN_TEST_CUDA_ARCHS", "80;90")


@dataclass(frozen=True)
class PluginBuild:
    folder: Path
    library: Path
    host_test: Path
    seconds: float


def find_tensorrt_headers(env=None) -> Path | str:
    """The folder holding NvInferRuntime.h, or why none was found (a string naming the fixes).

    An env variable that is set but points nowhere is reported, not skipped over silently.
    """
    env = os.environ if env is None else env
    for var, folder in (("TENSORRT_INCLUDE_DIR", env.get("TENSORRT_INCLUDE_DIR")),
                        ("TENSORRT_ROOT", env.get("TENSORRT_ROOT") and Path(env["TENSORRT_ROOT"]) / "include")):
        if folder:
            if (Path(folder) / HEADER).is_file():
                return Path(folder)
            return f"{var} is set but {folder} has no {HEADER}"
    for folder in (SHARED_TRT_HEADERS, *SYSTEM_TRT_HEADERS):
        if (folder / HEADER).is_file():
            return folder
    return (f"needs the TensorRT headers ({HEADER}) to build plugins/: set TENSORRT_INCLUDE_DIR=<folder with "
            f"{HEADER}> or TENSORRT_ROOT=<TensorRT install>, or place them in {SHARED_TRT_HEADERS}")


@functools.lru_cache(maxsize=None)
def _build() -> PluginBuild | str:
    """The build, or the reason it cannot be made here (a string)."""
    existing = os.environ.get("GDN_TEST_PLUGIN_BUILD")
    if existing:
        folder = Path(existing)
        return PluginBuild(folder, folder / "libgdn_plugins.so", folder / "pluginHostTest", 0.0)
    missing = [tool for tool in ("cmake", "nvcc") if shutil.which(tool) is None]
    if missing:
        return f"needs {' and '.join(missing)} on PATH to build plugins/"
    headers = find_tensorrt_headers()
    if isinstance(headers, str):
        return headers
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id:  # pytest-xdist: one build for all workers of this run
        from filelock import FileLock

        folder = Path(tempfile.gettempdir()) / f"gdn-plugins-build-{run_id}"
        with FileLock(str(folder) + ".lock"):
            done = folder / "BUILD_OK"
            if not done.is_file():
                folder.mkdir(exist_ok=True)
                build = _cmake(folder, headers)
                done.write_text(str(build.seconds))
                return build
        return PluginBuild(folder, folder / "libgdn_plugins.so", folder / "pluginHostTest", 0.0)
    return _cmake(Path(tempfile.mkdtemp(prefix="gdn-plugins-build-")), headers)


def _cmake(folder: Path, headers: Path) -> PluginBuild:
    """Configure and build plugins/ into `folder` (RuntimeError with the log's tail on failure)."""
    import time

    cmd = ["cmake", "-S", str(PLUGINS_SRC), "-B", str(folder), f"-DCMAKE_CUDA_ARCHITECTURES={TEST_ARCHS}",
           "-DCMAKE_BUILD_TYPE=Release", f"-DTENSORRT_INCLUDE_DIR={headers}"]
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
    """libgdn_plugins.so and pluginHostTest built from this tree (skips without cmake, nvcc or the
    TensorRT headers, naming how to supply them; a failing build is an error)."""
    result = _build()
    if isinstance(result, str):
        pytest.skip(result)
    return result
