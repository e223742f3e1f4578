"""Tiny checkpoints of every family, loaded and exported once per test session (shared by
tests/onnx and tests/runtime: exporting costs seconds)."""

from __future__ import annotations

from pathlib import Path

import torch

from gdn_export.onnx import export_onnx
from gdn_export.weights import load_checkpoint, make_tiny_checkpoint

FAMILIES = ("qwen3_5", "qwen3_next", "qwen3_5_moe", "olmo_hybrid")
_CHECKPOINTS: dict[str, Path] = {}
_EXPORTS: dict[tuple[str, torch.dtype], tuple[object, Path]] = {}


def tiny_checkpoint(family: str, root: Path) -> Path:
    if family not in _CHECKPOINTS:
        _CHECKPOINTS[family] = make_tiny_checkpoint(root / f"ckpt-{family}", family=family, seed=0)
    return _CHECKPOINTS[family]


def tiny_export(family: str, root: Path, dtype: torch.dtype = torch.float32):
    """(model, path of its exported .onnx), built on first use."""
    key = (family, dtype)
    if key not in _EXPORTS:
        model = load_checkpoint(tiny_checkpoint(family, root), dtype=dtype)
        name = f"{family}-{str(dtype).removeprefix('torch.')}.onnx"
        _EXPORTS[key] = (model, export_onnx(model, root / name))
    return _EXPORTS[key]
