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


def test_the_cuda_extension_loader_sits_below_the_ops():
    """gdn_export/cuda (the shared build of the plugins' kernels) imports no op: each op's wrappers
    (gdn_export/ops/<op>/cuda.py) call into it, never the other way."""
    cuda = OPS.parent / "cuda"
    bad = {str(p.relative_to(OPS.parent)): m for p in cuda.rglob("*.py") for m in _imports(p)
           if m.startswith("gdn_export.ops")}
    assert not bad, f"the extension loader imports ops: {bad}"


def test_the_cuda_backend_is_each_ops_own_wrapper():
    """The `cuda` backend's entries are the wrappers beside each op, found without building anything."""
    from gdn_export.ops import backends

    b = backends.get("cuda")
    assert {f.__module__ for f in (b.gated_delta_rule, b.gated_delta_rule_inplace, b.gated_delta_rule_fast,
                                   b.gated_delta_rule_inplace_fast, b.causal_conv1d, b.moe)} == {
        "gdn_export.ops.gated_delta_rule.cuda", "gdn_export.ops.causal_conv1d.cuda", "gdn_export.ops.moe.cuda"}
