"""What building the plugin library libgdn_plugins.so takes on this machine, said in one line:
the command to run, or what to install or pass first (docs/tensorrt.md, "Building the plugin
library").

    how_to_build() -> "build it with `cmake -S .../plugins -B .../plugins/build && cmake --build ... -j`"

The TensorRT headers are looked for where plugins/CMakeLists.txt looks: -DTENSORRT_INCLUDE_DIR
(here: $TENSORRT_INCLUDE_DIR), $TENSORRT_ROOT/include, the repository's ../shared copy, then the
usual install folders. Nothing is built or imported here.
"""

from __future__ import annotations

import os
import shutil
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
HEADER = "NvInferRuntime.h"
SOURCES = REPO_ROOT / "plugins"
# plugins/CMakeLists.txt's PATHS, in its order after -DTENSORRT_INCLUDE_DIR and $TENSORRT_ROOT
CMAKE_PATHS = (REPO_ROOT.parent / "shared" / "third_party" / "tensorrt" / "include",
               REPO_ROOT / "shared" / "third_party" / "tensorrt" / "include",
               Path("/usr/include/x86_64-linux-gnu"), Path("/usr/include/aarch64-linux-gnu"),
               Path("/usr/local/tensorrt/include"), Path("/opt/tensorrt/include"))
HEADERS_REPO = "https://github.com/NVIDIA/TensorRT"
CUDA_NVCC = Path("/usr/local/cuda/bin/nvcc")  # where CMake finds nvcc off the PATH


def find_headers() -> tuple[Path | None, bool]:
    """(folder holding NvInferRuntime.h or None, whether cmake finds it without being told)."""
    given = os.environ.get("TENSORRT_INCLUDE_DIR")
    if given and (Path(given) / HEADER).is_file():
        return Path(given), False
    root = os.environ.get("TENSORRT_ROOT")
    for folder in ([Path(root) / "include"] if root else []) + list(CMAKE_PATHS):
        if (folder / HEADER).is_file():
            return folder, True
    return None, False


def _trt_version() -> str | None:
    """The installed TensorRT's "X.Y" (from the package metadata, nothing imported)."""
    for dist in ("tensorrt", "tensorrt-cu12", "tensorrt-cu13"):
        try:
            return ".".join(metadata.version(dist).split(".")[:2])
        except metadata.PackageNotFoundError:
            continue
    return None


def _headers_hint() -> str:
    version = _trt_version()
    branch = f"release/{version}" if version else "the release/X.Y branch of your TensorRT version"
    return (f"the TensorRT headers ({HEADER}) are in none of $TENSORRT_INCLUDE_DIR, $TENSORRT_ROOT/include, "
            f"{', '.join(map(str, CMAKE_PATHS))}: install your TensorRT's headers (the libnvinfer-dev package or "
            f"a TensorRT tarball's include/), or `git clone --depth 1 -b {branch} {HEADERS_REPO}` (TensorRT-RTX: "
            f"its SDK's include/) and add -DTENSORRT_INCLUDE_DIR=<that include/ folder> to the first cmake command")


def _shown(path: Path) -> str:
    """`path` relative to the current folder when inside it (what the user types), else absolute."""
    try:
        return str(path.relative_to(Path.cwd())) or "."
    except ValueError:
        return str(path)


def how_to_build() -> str:
    """One line (no trailing period): the cmake commands that build the library here, preceded by
    what must be installed or passed first when something is missing."""
    if not (SOURCES / "CMakeLists.txt").is_file():
        return (f"its sources (plugins/ of the gdn-export repository) are not beside this installation "
                f"({SOURCES}): clone the repository and build it there, then pass --plugins")
    headers, found_by_cmake = find_headers()
    configure = f"cmake -S {_shown(SOURCES)} -B {_shown(SOURCES / 'build')}"
    if headers is not None and not found_by_cmake:
        configure += f" -DTENSORRT_INCLUDE_DIR={headers}"
    command = f"`{configure} && cmake --build {_shown(SOURCES / 'build')} -j`"
    missing = []
    if shutil.which("cmake") is None:
        missing.append("cmake >= 3.18 (`pip install cmake`)")
    if shutil.which("nvcc") is None and not CUDA_NVCC.is_file():
        missing.append("the CUDA toolkit's nvcc 12.x / 13.x (not on PATH)")
    if headers is None:
        missing.append(_headers_hint())
    if missing:
        return f"building it with {command} needs " + "; and ".join(missing)
    return f"build it with {command} (TensorRT headers: {headers})"
