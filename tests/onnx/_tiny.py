"""Tiny checkpoints of every family, loaded and exported once per test session (shared by
tests/onnx and tests/runtime: exporting costs seconds); under pytest-xdist once per run, in a folder
all workers share (the first one to ask writes, under a lock; the others load the same file)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
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


def _shared(root: Path, name: str):
    """(folder, lock) for `name`: the run's shared folder under pytest-xdist, else `root` unlocked."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run_id:
        return root, contextlib.nullcontext()
    from filelock import FileLock

    folder = Path(tempfile.gettempdir()) / f"gdn-tiny-{run_id}"
    folder.mkdir(exist_ok=True)
    return folder, FileLock(str(folder / f"{name}.lock"))


def tiny_checkpoint(family: str, root: Path) -> Path:
    if family not in _CHECKPOINTS:
        folder, lock = _shared(root, f"ckpt-{family}")
        with lock:
            path = folder / f"ckpt-{family}"
            if not (path / "config.json").is_file():
                make_tiny_checkpoint(path, family=family, seed=0)
        _CHECKPOINTS[family] = path
    return _CHECKPOINTS[family]


def tiny_export(family: str, root: Path, dtype: torch.dtype = torch.float32,
                layout: DeployLayout = TEST_LAYOUT):
    """(model, path of its exported .onnx), built on first use; the model is shared by every caller
    of the same key: do not change its layout."""
    key = (family, dtype, layout)
    if key not in _EXPORTS:
        model = load_checkpoint(tiny_checkpoint(family, root), dtype=dtype)
        model.layout = layout
        tag = hashlib.sha1(repr(layout).encode()).hexdigest()[:10]
        name = f"{family}-{str(dtype).removeprefix('torch.')}-{tag}.onnx"
        folder, lock = _shared(root, name)
        with lock:
            path = folder / name
            if not path.is_file():
                export_onnx(model, path)
        _EXPORTS[key] = (model, path)
    return _EXPORTS[key]
