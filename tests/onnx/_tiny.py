"""Tiny checkpoints of every family, loaded and exported once per test session (shared by
tests/onnx and tests/runtime: exporting costs seconds)."""

from __future__ import annotations

from pathlib import Path

import torch

from gdn_export.layout import DeployLayout
from gdn_export.onnx import export_onnx
from gdn_export.weights import load_checkpoint, make_tiny_checkpoint

FAMILIES = ("qwen3_5", "qwen3_next", "qwen3_5_moe", "olmo_hybrid")
# Room for the longest test prompt (130) plus 8 decode steps; small, so ORT's attention stays cheap.
TEST_LAYOUT = DeployLayout.make(cache_len=160)
CONCAT = DeployLayout.make(kv_cache="concat", logits="all")
_CHECKPOINTS: dict[str, Path] = {}
_EXPORTS: dict[tuple, tuple[object, Path]] = {}


def tiny_checkpoint(family: str, root: Path) -> Path:
    if family not in _CHECKPOINTS:
        _CHECKPOINTS[family] = make_tiny_checkpoint(root / f"ckpt-{family}", family=family, seed=0)
    return _CHECKPOINTS[family]


def tiny_export(family: str, root: Path, dtype: torch.dtype = torch.float32,
                layout: DeployLayout = TEST_LAYOUT):
    """(model, path of its exported .onnx), built on first use; the model is shared by every caller
    of the same key: do not change its layout."""
    key = (family, dtype, layout)
    if key not in _EXPORTS:
        model = load_checkpoint(tiny_checkpoint(family, root), dtype=dtype)
        model.layout = layout
        name = f"{family}-{str(dtype).removeprefix('torch.')}-{len(_EXPORTS)}.onnx"
        _EXPORTS[key] = (model, export_onnx(model, root / name))
    return _EXPORTS[key]
