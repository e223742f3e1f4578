"""The shared loader of our CUDA kernels as one PyTorch extension, and the checks every op's wrapper
(gdn_export/ops/<op>/cuda.py) makes before calling it.

    load()      the compiled extension (extension.cpp binding kernels/<op>/cuda/*.cu), built on first
                call for the running GPU into ~/.cache/gdn_export/cuda_ext (GDN_EXPORT_CUDA_BUILD_DIR)
    loaded()    the extension if already built in this process, else None (the ops' fast entries)

Every failure is one GdnExportError line: no GPU, a failed build, a tensor on the CPU, a dtype the
kernels do not take, an output buffer of the wrong shape.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import torch

import kernels
from gdn_export.errors import GdnExportError

# The kernels' sources ship inside the `kernels` package (kernels/<op>/cuda/, kernels/cuda_common/), so
# the extension builds from an installed copy as well as from a checkout.
KERNELS_DIR = Path(kernels.__file__).resolve().parent
SOURCES = (
    Path(__file__).resolve().parent / "extension.cpp",
    KERNELS_DIR / "gated_delta_rule" / "cuda" / "gatedDeltaRuleKernels.cu",
    KERNELS_DIR / "causal_conv1d" / "cuda" / "causalConv1dKernels.cu",
    KERNELS_DIR / "moe" / "cuda" / "moeKernels.cu",
)
# Headers the build depends on: a change to any of them must rebuild the extension.
HEADERS = tuple(sorted(p for pattern in ("*/cuda/*.h", "*/cuda/*.cuh", "cuda_common/*.cuh")
                       for p in KERNELS_DIR.glob(pattern)))
BUILD_DIR_ENV = "GDN_EXPORT_CUDA_BUILD_DIR"
ACTIVATIONS = (torch.float32, torch.float16, torch.bfloat16)

_lock = threading.Lock()
_module = None


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def _build_dir(arch: str) -> Path:
    digest = hashlib.sha256()
    for path in SOURCES + HEADERS:
        digest.update(path.read_bytes())
    tag = f"sm{arch.replace('.', '')}-torch{torch.__version__}-{digest.hexdigest()[:12]}"
    root = Path(os.environ.get(BUILD_DIR_ENV, Path.home() / ".cache" / "gdn_export" / "cuda_ext"))
    path = root / tag
    path.mkdir(parents=True, exist_ok=True)
    return path


def load():
    """The compiled extension, built on first call for the current GPU (minutes the first time)."""
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is not None:
            return _module
        try:
            if not torch.cuda.is_available():
                raise RuntimeError("no CUDA device is visible to PyTorch")
            from torch.utils import cpp_extension

            arch = _arch()
            os.environ.setdefault("TORCH_CUDA_ARCH_LIST", arch)
            # No -std flag: the binding includes torch headers and must use torch's own standard
            # (C++20 since torch 2.10); a -std=c++17 here made every TORCH_CHECK failure segfault.
            flags = ["-O3"]
            _module = cpp_extension.load(
                name="gdn_export_cuda_ext",
                sources=[str(s) for s in SOURCES],
                extra_include_paths=[str(KERNELS_DIR)],
                extra_cflags=flags,
                extra_cuda_cflags=flags + ["--expt-relaxed-constexpr", "-lineinfo"],
                build_directory=str(_build_dir(arch)),
                verbose=bool(os.environ.get("GDN_EXPORT_CUDA_VERBOSE")),
            )
        except Exception as exc:  # a failed build or import: one clear line for the user
            raise GdnExportError(f"cuda backend unavailable: {type(exc).__name__}: {exc}".splitlines()[0]) from exc
    return _module


def loaded():
    """The extension when this process has already built or loaded it, else None (never builds)."""
    return _module


def require_cuda(**tensors) -> None:
    """GdnExportError naming the first given tensor (None skipped) that is not on a CUDA device."""
    for name, t in tensors.items():
        if t is not None and t.device.type != "cuda":
            raise GdnExportError(f"cuda backend needs CUDA tensors, got {name} on {t.device}")


def compute_dtype(dtype: torch.dtype, name: str) -> torch.dtype:
    """The dtype the kernels run a tensor of `dtype` in: itself for fp32 / fp16 / bf16, fp32 for
    float64; anything else is a GdnExportError naming `name`."""
    if dtype == torch.float64:
        return torch.float32
    if dtype not in ACTIVATIONS:
        raise GdnExportError(f"cuda backend: {name} must be a floating tensor, got {dtype}")
    return dtype


def check_out(name, t, shape, dtype, device) -> None:
    """An output buffer given by the caller: exact shape, dtype, device, contiguous."""
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.device != device or not t.is_contiguous():
        raise GdnExportError(
            f"cuda backend: {name} must be a contiguous {dtype} tensor of shape {tuple(shape)} on {device}, "
            f"got {t.dtype} {tuple(t.shape)} on {t.device}{'' if t.is_contiguous() else ' (not contiguous)'}"
        )
