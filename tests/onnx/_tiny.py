"""Tiny checkpoints of every family, loaded and exported once (shared by tests/onnx and
tests/runtime: exporting costs seconds). Under pytest-xdist, in a folder every worker and every later
session shares while gdn_export's sources and torch stay the same (named by their hash; the first
process to ask writes under a lock, the others load the same file)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import torch

from gdn_export.layout import DeployLayout
from gdn_export.onnx import export_onnx
from gdn_export.weights import load_checkpoint, make_tiny_checkpoint

FAMILIES = ("qwen3_5", "qwen3_next", "qwen3_5_moe", "olmo_hybrid")
# Two decoder layers, a GDN layer then an attention layer: one layer of each kind, which is what an
# export traces (gdn_export.onnx.stamp: ~4.5 s on a 2-core CPU, then ~0.2 s per export of the same
# architecture from the trace cache that tests/conftest.py keeps in the temp dir). Deeper stacks
# (state of several GDN layers) are tested on make_tiny_checkpoint's default 4 layers and
# transformers' checkpoints (tests/test_transformers_parity.py, tests/models).
TWO_LAYERS = {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]}
# Room for the longest test prompt (130) plus 8 decode steps; small, so ORT's attention stays cheap.
TEST_LAYOUT = DeployLayout.make(cache_len=160)
CONCAT = DeployLayout.make(kv_cache="concat", logits="all")
_CHECKPOINTS: dict[str, Path] = {}
_EXPORTS: dict[tuple, tuple[object, Path]] = {}


@functools.lru_cache(maxsize=None)
def _source_tag() -> str:
    """Hash of gdn_export's Python sources, this file (the checkpoints' sizes) and torch's version
    (what an export depends on)."""
    import gdn_export

    digest = hashlib.sha256(torch.__version__.encode() + Path(__file__).read_bytes())
    package = Path(gdn_export.__file__).parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _shared(root: Path, name: str):
    """(folder, lock) for `name`: the shared folder under pytest-xdist, else `root` unlocked."""
    if not os.environ.get("PYTEST_XDIST_TESTRUNUID"):
        return root, contextlib.nullcontext()
    from filelock import FileLock

    folder = Path(tempfile.gettempdir()) / f"gdn-tiny-{_source_tag()}"
    folder.mkdir(exist_ok=True)
    return folder, FileLock(str(folder / f"{name}.lock"))


def tiny_checkpoint(family: str, root: Path) -> Path:
    if family not in _CHECKPOINTS:
        folder, lock = _shared(root, f"ckpt-{family}")
        with lock:
            path = folder / f"ckpt-{family}"
            if not (path / "config.json").is_file():
                make_tiny_checkpoint(path, family=family, seed=0, **TWO_LAYERS)
        _CHECKPOINTS[family] = path
    return _CHECKPOINTS[family]


def tiny_export(family: str, root: Path, dtype: torch.dtype = torch.float32,
                layout: DeployLayout = TEST_LAYOUT, onnx_ops: str = "gdn"):
    """(model, path of its exported .onnx), built on first use; the model is shared by every caller
    of the same (family, dtype, layout), whatever the form: do not change its layout."""
    key = (family, dtype, layout, onnx_ops)
    if key not in _EXPORTS:
        model_key = next((k for k in _EXPORTS if k[:3] == key[:3]), None)
        if model_key is None:
            model = load_checkpoint(tiny_checkpoint(family, root), dtype=dtype)
            model.layout = layout
        else:
            model = _EXPORTS[model_key][0]
        tag = hashlib.sha1(repr(layout).encode()).hexdigest()[:10]
        form = "" if onnx_ops == "gdn" else f"-{onnx_ops}"
        name = f"{family}-{str(dtype).removeprefix('torch.')}-{tag}{form}.onnx"
        folder, lock = _shared(root, name)
        with lock:
            path = folder / name
            if not path.is_file():
                export_onnx(model, path, onnx_ops=onnx_ops)
        _EXPORTS[key] = (model, path)
    return _EXPORTS[key]


def tiny_rewritten(family: str, root: Path, form: str, dtype: torch.dtype = torch.float32,
                   layout: DeployLayout = TEST_LAYOUT):
    """(model, path of form `form` ("standard" / "ort") of tiny_export's gdn file), made by the
    rewrite export_onnx(..., onnx_ops=form) applies to its gdn file after the trace
    (gdn_export.onnx.export.rewrite_form): the form without a second trace.
    tests/onnx/test_standard_export.py and tests/cli/test_onnx_ops.py check that both ways give the
    same file."""
    from gdn_export.onnx.export import rewrite_form

    model, gdn_path = tiny_export(family, root, dtype=dtype, layout=layout)
    name = f"{gdn_path.stem}-{form}-rewritten.onnx"
    _, lock = _shared(root, name)
    path = gdn_path.with_name(name)
    with lock:
        if not path.is_file():
            tmp = path.with_name(f".{name}.{os.getpid()}")
            shutil.copyfile(gdn_path, tmp)
            rewrite_form(tmp, form)
            os.replace(tmp, path)
    return model, path


def tiny_standard(family: str, root: Path, dtype: torch.dtype = torch.float32, layout: DeployLayout = TEST_LAYOUT):
    """tiny_rewritten(..., "standard")."""
    return tiny_rewritten(family, root, "standard", dtype, layout)


def tiny_ort(family: str, root: Path, dtype: torch.dtype = torch.float32, layout: DeployLayout = TEST_LAYOUT):
    """tiny_rewritten(..., "ort")."""
    return tiny_rewritten(family, root, "ort", dtype, layout)
