"""gdn_export/ops (the ops, their kernels and backends) depends on no application layer: it may
import gdn_export.errors and itself, never cli / runtime / onnx / trt / models / modules / weights /
validate (which sit above it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

OPS = Path(__file__).resolve().parents[2] / "gdn_export" / "ops"
ABOVE = ("cli", "runtime", "onnx", "trt", "models", "modules", "weights", "validate", "layout", "config",
         "hf_config")


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            if node.module == "gdn_export":  # from gdn_export import cli
                yield from (f"gdn_export.{a.name}" for a in node.names)


@pytest.mark.parametrize("path", sorted(OPS.rglob("*.py")), ids=lambda p: str(p.relative_to(OPS)))
def test_ops_import_no_application_layer(path):
    bad = [m for m in _imports(path) if m.split(".")[:2] in (["gdn_export", a] for a in ABOVE)]
    assert not bad, f"{path.relative_to(OPS.parent)} imports {bad}"


def test_the_scan_sees_the_ops():
    assert len(list(OPS.rglob("*.py"))) > 10
    assert "gdn_export.errors" in set(_imports(OPS / "backends.py"))
