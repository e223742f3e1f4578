"""Which files are the parts of a vision-language export, read from their metadata alone (no
weights, no session): the language graph (`gdn_export.vlm.role` "language" in metadata_props) and
an engine built from it (its build record keeps the ONNX metadata)."""

from __future__ import annotations

from pathlib import Path

from gdn_export.trt.build import ENGINE_SUFFIXES, record_metadata
from gdn_export.vlm.export import KEY_ROLE


def _is_file(path: Path) -> bool:
    """Path.is_file, False where the path cannot be looked at (the text runner names the reason)."""
    try:
        return path.is_file()
    except OSError:
        return False


def is_vlm_onnx(path) -> bool:
    """Whether `path` is the language graph of a vision-language export."""
    path = Path(path)
    if path.suffix != ".onnx" or not _is_file(path):
        return False
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # not ONNX: the text runner reports it
        return False
    return any(p.key == KEY_ROLE and p.value == "language" for p in model.metadata_props)


def is_vlm_engine(path) -> bool:
    """Whether `path` is a language engine built from a vision-language export (its build record
    keeps the ONNX metadata)."""
    path = Path(path)
    if path.suffix not in ENGINE_SUFFIXES or not _is_file(path):
        return False
    return record_metadata(path).get(KEY_ROLE) == "language"
