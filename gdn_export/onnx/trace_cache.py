"""The trace cache: stamp templates (gdn_export.onnx.stamp) on disk, so that a second export of the
same architecture traces nothing.

An entry is one ONNX file `<key>.onnx` holding a template's graph structure and its constants, no
weights (kilobytes to a few MB). The key hashes everything the template depends on: gdn_export's
sources, the versions of torch, onnxscript, onnx_ir, onnx and Python, the model's config (but its
number and order of layers), the signature of its skeleton modules and of each layer kind in order
(gdn_export.onnx.kinds), the deployment layout, the dtype and the opset. Entries are written to a
temporary name and renamed; an entry that does not load is ignored (and traced again); the folder
keeps the MAX_ENTRIES most recently used.

    GDN_EXPORT_CACHE   the cache folder; "off" (or "0", "") disables the cache. Default
                       $XDG_CACHE_HOME/gdn-export, else ~/.cache/gdn-export.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

ENV = "GDN_EXPORT_CACHE"
OFF = ("off", "0", "")
FORMAT = 1  # of the entries: bump when the template's stored form changes
MAX_ENTRIES = 64  # the least recently used go first (every source edit or upgrade makes new keys)


def cache_dir() -> Path | None:
    """The cache folder (not created), or None when the cache is off."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if value.strip().lower() in OFF else Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gdn-export"


@functools.lru_cache(maxsize=None)
def _environment_digest() -> str:
    """Hash of gdn_export's Python sources and the versions of the packages a trace goes through."""
    import onnx
    import onnx_ir
    import onnxscript
    import torch

    import gdn_export

    digest = hashlib.sha256(json.dumps([FORMAT, sys.version, torch.__version__, onnxscript.__version__,
                                        onnx_ir.__version__, onnx.__version__]).encode())
    package = Path(gdn_export.__file__).parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def cache_key(model, kinds, opset: int) -> str:
    """The key of `model`'s template (HybridForCausalLM with layer kinds `kinds`) at `opset`."""
    from gdn_export.onnx.kinds import module_signature

    config = {k: v for k, v in dataclasses.asdict(model.config).items()
              if k not in ("num_hidden_layers", "layer_kinds", "mlp_only_layers")}
    skeleton = [(name, module_signature(m)) for name, m in model.named_children() if name != "model"]
    skeleton += [(f"model.{name}", module_signature(m)) for name, m in model.model.named_children() if name != "layers"]
    attrs = {k: repr(v) for k, v in sorted(vars(model).items()) if not k.startswith("_") and k not in ("training", "config")}
    text = json.dumps([_environment_digest(), type(model).__qualname__, repr(config), skeleton, attrs,
                       list(kinds.signatures), repr(model.layout), str(model.dtype), opset])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def entry_path(key: str) -> Path | None:
    folder = cache_dir()
    return None if folder is None else folder / f"{key}.onnx"


def describe(key: str) -> str:
    path = entry_path(key)
    return "off" if path is None else str(path)


def load(key: str):
    """The template stored under `key`, or None (cache off, no entry, or an entry that does not load)."""
    path = entry_path(key)
    if path is None or not path.is_file():
        return None
    import onnx

    from gdn_export.onnx.stamp import Template

    try:
        template = Template.from_proto(onnx.load(str(path)))
    except Exception:  # a damaged entry is traced again and overwritten
        return None
    try:
        os.utime(path)  # recently used
    except OSError:
        pass
    return template


def store(key: str, template) -> bool:
    """Write `template` under `key` (atomically); False when the cache is off or cannot be written."""
    path = entry_path(key)
    if path is None:
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = template.to_proto().SerializeToString()
        fd, tmp = tempfile.mkstemp(prefix=f".{key}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _prune(path.parent)
    except OSError:
        return False
    return True


def _prune(folder: Path) -> None:
    """Remove all but the MAX_ENTRIES most recently used entries of `folder`."""
    entries = []
    for p in folder.glob("*.onnx"):
        try:
            entries.append((p.stat().st_mtime, p))
        except OSError:  # removed meanwhile by another process
            pass
    for _, p in sorted(entries, reverse=True)[MAX_ENTRIES:]:
        p.unlink(missing_ok=True)
