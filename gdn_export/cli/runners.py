"""Open a runner (torch / ort / trt) from a path, picking the backend from the path if not given."""

from __future__ import annotations

import os
from pathlib import Path

from gdn_export.cli.common import checkpoint_dir, input_file, torch_dtype
from gdn_export.errors import InputError
from gdn_export.trt.build import ENGINE_SUFFIXES

BACKENDS = ("torch", "ort", "trt")


def guess_backend(path: str) -> str:
    """torch for a folder, ort for a .onnx, trt for an engine file (a folder named like a file
    without a config.json goes by its suffix: input_file then says it is a folder)."""
    p = Path(path)
    if p.is_dir() and ((p / "config.json").exists() or p.suffix not in (".onnx", *ENGINE_SUFFIXES)):
        return "torch"
    if p.suffix == ".onnx":
        return "ort"
    if p.suffix in ENGINE_SUFFIXES:
        return "trt"
    raise InputError(f"cannot tell the backend of {path!r}: give a checkpoint folder, a .onnx or an "
                     f".engine file, or --backend")


def open_runner(path: str, backend: str | None = None, *, dtype: str = "fp32", device: str = "cpu",
                plugins: str | None = None, op_backend: str | None = None, layout=None,
                ort_kernels: str = "auto"):
    """A `gdn_export.runtime.base.Runner` for `path`; `layout` (a DeployLayout) shapes a PyTorch
    model's cache and outputs (default: the export default). A checkpoint on a CUDA device runs on
    GraphRunner (gdn_export.runtime.cuda_graph), elsewhere on TorchRunner."""
    backend = backend or guess_backend(path)
    if backend == "torch" and os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"--backend torch needs a checkpoint folder, got {path}")
    if backend == "torch":
        checkpoint_dir(path)
    else:
        input_file(path, {"ort": "ONNX file", "trt": "engine file"}.get(backend, "model file"))
    if backend == "torch":
        from gdn_export.runtime.torch_runner import TorchRunner
        from gdn_export.weights import load_checkpoint

        check_device(device, op_backend)
        model = load_checkpoint(path, dtype=torch_dtype(dtype))
        if layout is not None:
            model.layout = layout
        if device.startswith("cuda"):
            # The fast path: static states, decode steps replayed from a CUDA graph.
            from gdn_export.runtime.cuda_graph import GraphRunner

            return GraphRunner(model, device=device, op_backend=op_backend)
        return TorchRunner(model, device=device, op_backend=op_backend)
    if backend == "ort":
        from gdn_export.runtime.ort_runner import OrtRunner

        return OrtRunner(path, device=device, kernels=ort_kernels)
    if backend == "trt":
        from gdn_export.trt.runtime import TrtRunner

        return TrtRunner(path, plugins=plugins)
    raise InputError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def add_ort_kernels(p) -> None:
    """--ort-kernels: how ONNX Runtime runs the GDN layers (gdn_export.onnx.ort_native)."""
    p.add_argument("--ort-kernels", choices=("auto", "native", "functions"), default="auto",
                   help="ort backend: native = ONNX Runtime's com.microsoft LinearAttention / "
                   "CausalConvWithState kernels, functions = standard-ONNX function bodies, auto "
                   "(default) = native where they apply (the choice is printed); an --onnx-ops ort "
                   "file runs on ORT's GatedDeltaNet kernels (functions is refused there)")


def check_device(device: str, op_backend: str | None = None) -> None:
    """InputError for a --device torch cannot use here, or an --op-backend that cannot run on it
    (torch and triton would raise AssertionError / RuntimeError with a traceback)."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise InputError(f"--device {device!r} is not a torch device (cpu, cuda, cuda:1, ...)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {device}: torch sees no CUDA GPU here")
    if dev.type != "cuda" and op_backend == "cuda":
        raise InputError(f"--op-backend cuda needs --device cuda, got --device {device}")
    if dev.type != "cuda" and op_backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        raise InputError(f"--op-backend triton needs --device cuda (or TRITON_INTERPRET=1 on the CPU), "
                         f"got --device {device}")
