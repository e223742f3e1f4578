"""Build plugins/ (libgdn_plugins.so + pluginHostTest) with the machine's nvcc and cmake, against
TensorRT headers found by `find_tensorrt_headers` (in this order: env TENSORRT_INCLUDE_DIR, env
TENSORRT_ROOT/include, the repository's ../shared/third_party/tensorrt/include, the usual install
folders). Without headers, cmake or nvcc every test that needs the build skips with the reason; a
cmake or compiler failure with all three present is an error.

Shared by tests/plugins and tests/trt (both conftests import `plugin_build`). One build serves every
pytest process that asks for the same sources: the folder is named by a hash of plugins/ and kernels/ (their C++, CUDA and CMake files), the
architectures, the device-code flags and the header folder, and guarded by a file lock, so xdist
workers wait on the first one and a second pytest session (CI's slow tier) reuses it.
`start_background_build` starts it when a session begins, so it compiles beside the other tests
instead of stalling a worker (tests/conftest.py also orders the tests that need it last). The
gated-delta-rule kernels take ~105 s of one core to compile -O3 for one architecture: tests build
one, the GPU's (sm_90 on the H200) or sm_80 without a GPU (`_default_archs`), and without a GPU
unoptimized device code (`_device_code_flags`, ~30 s); override with GDN_TEST_CUDA_ARCHS (e.g.
"80;90") and GDN_TEST_CUDA_FLAGS, or point GDN_TEST_PLUGIN_BUILD at an existing build folder to
skip building.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS_SRC = REPO / "plugins"
# The CUDA kernels the plugins compile (kernels/<op>/cuda/, kernels/cuda_common/).
KERNELS_SRC = REPO / "kernels"
SOURCE_SUFFIXES = {".cu", ".cuh", ".h", ".cpp", ".txt", ".sh"}
SHARED_TRT_HEADERS = REPO.parent / "shared" / "third_party" / "tensorrt" / "include"
# The folders plugins/CMakeLists.txt also searches last.
SYSTEM_TRT_HEADERS = (Path("/usr/include/x86_64-linux-gnu"), Path("/usr/include/aarch64-linux-gnu"),
                      Path("/usr/local/tensorrt/include"), Path("/opt/tensorrt/include"))
HEADER = "NvInferRuntime.h"
_RUNNING: set[subprocess.Popen] = set()  # the cmake steps this process runs now
BUILD_LOG = "build.log"  # cmake's and the compilers' output, kept beside the build


@functools.lru_cache(maxsize=None)
def _gpu_capability() -> tuple[int, int] | None:
    """The CUDA GPU's compute capability, or None without one; None too where torch is not installed
    yet (.ci/run starts the build while the packages install: a CPU-only machine)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


def _default_archs() -> str:
    """The GPU's own architecture where there is one (the H200: "90"); without a GPU "80", the oldest
    the plugins support: engine builds there load the library but never launch a kernel, so the
    build is the check that every plugin source compiles for sm_80 without a warning."""
    capability = _gpu_capability()
    return "80" if capability is None else "{}{}".format(*capability)


TEST_ARCHS = os.environ.get("GDN_TEST_CUDA_ARCHS") or _default_archs()


def _device_code_flags() -> str:
    """Extra CMAKE_CUDA_FLAGS of the test build. Without a GPU no kernel of the library ever runs
    (engine builds load it and call the plugins' host code), so the build is a compile check and
    its device code is compiled unoptimized: the front end (every error and warning of the sources)
    and ptxas for sm_80 still run, in ~30 instead of ~105 CPU-seconds for the gated-delta-rule
    kernels (2-core Sapphire Rapids, nvcc 13.0). With a GPU the kernels run: -O3 as released.
    GDN_TEST_CUDA_FLAGS overrides."""
    if "GDN_TEST_CUDA_FLAGS" in os.environ:
        return os.environ["GDN_TEST_CUDA_FLAGS"]
    return "-Xcicc -O0 -Xptxas -O0" if _gpu_capability() is None else ""


TEST_CUDA_FLAGS = _device_code_flags()


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


def _why_not() -> str | None:
    """Why the build cannot be made here, or None."""
    missing = [tool for tool in ("cmake", "nvcc") if shutil.which(tool) is None]
    if missing:
        return f"needs {' and '.join(missing)} on PATH to build plugins/"
    headers = find_tensorrt_headers()
    return headers if isinstance(headers, str) else None


def build_folder(headers: Path) -> Path:
    """The shared build folder for this source tree, architectures and header folder."""
    digest = hashlib.sha256(f"{TEST_ARCHS}\0{TEST_CUDA_FLAGS}\0{headers.resolve()}\0".encode())
    for src in (PLUGINS_SRC, KERNELS_SRC):
        for path in sorted(p for p in src.rglob("*") if p.is_file() and p.suffix in SOURCE_SUFFIXES):
            digest.update(f"{src.name}/{path.relative_to(src)}".encode() + b"\0" + path.read_bytes() + b"\0")
    return Path(tempfile.gettempdir()) / f"gdn-plugins-build-{digest.hexdigest()[:16]}"


def _existing(folder: Path) -> PluginBuild:
    return PluginBuild(folder, folder / "libgdn_plugins.so", folder / "pluginHostTest", 0.0)


def _shared_build(headers: Path) -> PluginBuild:
    """Build into the shared folder under its lock, or reuse a finished build there."""
    from filelock import FileLock

    folder = build_folder(headers)
    with FileLock(str(folder) + ".lock"):
        done, failed = folder / "BUILD_OK", folder / "BUILD_FAILED"
        if done.is_file():
            return _existing(folder)
        started = float(os.environ.get("GDN_TEST_SESSION_START", "inf"))
        if failed.is_file() and failed.stat().st_mtime >= started:  # failed earlier in this session
            raise RuntimeError(failed.read_text())
        shutil.rmtree(folder, ignore_errors=True)  # an interrupted or older failed build starts over
        folder.mkdir()
        try:
            build = _cmake(folder, headers)
        except RuntimeError as err:
            failed.write_text(str(err))
            raise
        done.write_text(str(build.seconds))
        return build


@functools.lru_cache(maxsize=None)
def _build() -> PluginBuild | str:
    """The build, or the reason it cannot be made here (a string)."""
    existing = os.environ.get("GDN_TEST_PLUGIN_BUILD")
    if existing:
        return _existing(Path(existing))
    reason = _why_not()
    if reason:
        return reason
    return _shared_build(find_tensorrt_headers())


def stop_builds() -> None:
    """End the builds this process started that still run (a session stopped early, e.g. by -x)."""
    import signal

    for proc in list(_RUNNING):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)


def start_background_build() -> None:
    """Start the shared build in a daemon thread (no-op when it cannot be made or is done); a test
    asking for `plugin_build` meanwhile waits on the folder's lock. A failure is not raised here:
    it is recorded in the folder's BUILD_FAILED, which each test's `_build()` raises."""
    import threading

    if os.environ.get("GDN_TEST_PLUGIN_BUILD") or _why_not():
        return
    headers = find_tensorrt_headers()
    if (build_folder(headers) / "BUILD_OK").is_file():
        return

    def work():
        try:
            _shared_build(headers)
        except Exception:  # noqa: BLE001  (reported by the test that needs the build)
            pass

    threading.Thread(target=work, name="gdn-plugins-build", daemon=True).start()


def _cmake(folder: Path, headers: Path) -> PluginBuild:
    """Configure and build plugins/ into `folder` (RuntimeError with the log's tail on failure)."""
    import time

    cmd = ["cmake", "-S", str(PLUGINS_SRC), "-B", str(folder), f"-DCMAKE_CUDA_ARCHITECTURES={TEST_ARCHS}",
           f"-DCMAKE_CUDA_FLAGS={TEST_CUDA_FLAGS}", "-DCMAKE_BUILD_TYPE=Release",
           f"-DTENSORRT_INCLUDE_DIR={headers}"]
    t0 = time.perf_counter()
    log = []
    for step in (cmd, ["cmake", "--build", str(folder), "-j", str(os.cpu_count() or 2)]):
        # Its own process group, so that stop_builds() can end make and the compilers with it.
        proc = subprocess.Popen(step, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        _RUNNING.add(proc)
        try:
            output, _ = proc.communicate()
        finally:
            _RUNNING.discard(proc)
        log.append(output)
        if proc.returncode != 0:
            tail = "\n".join(output.splitlines()[-40:])
            raise RuntimeError(f"{' '.join(step)} failed ({proc.returncode}):\n{tail}")
    (folder / BUILD_LOG).write_text("\n".join(log))
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
