"""Tiny checkpoints with a multi-token-prediction head (make-tiny's mtp_layers=1), two layers (a GDN
layer, then attention), made once per test process (or once per xdist run: tests/onnx/_tiny.py)."""

from __future__ import annotations

from pathlib import Path

from gdn_export.weights import make_tiny_checkpoint
from tests.onnx._tiny import TWO_LAYERS, _shared

MTP_FAMILIES = ("qwen3_5", "qwen3_next", "qwen3_5_moe")
_PATHS: dict[tuple, Path] = {}


def mtp_checkpoint(family: str, root: Path, dtype: str = "float32") -> Path:
    """A tiny `family` checkpoint with a one-layer MTP head, stored in `dtype`."""
    key = (family, dtype)
    if key not in _PATHS:
        name = f"mtp-{family}-{dtype}"
        folder, lock = _shared(root, name)
        with lock:
            path = folder / name
            if not (path / "config.json").is_file():
                make_tiny_checkpoint(path, family=family, seed=0, mtp_layers=1, dtype=dtype, **TWO_LAYERS)
        _PATHS[key] = path
    return _PATHS[key]
