"""Equality checks on ONNX graphs and files whose failure message is one short line (pytest would
print both serialized models in full: megabytes on CI, where it does not truncate)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx


def file_digest(path: Path) -> str:
    """sha256 of the file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _first_difference(got, want, field: str, name) -> str | None:
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            if name(a) == name(b):
                return f"{field}[{i}] {name(a)!r} differs in its other fields (attributes, type, data)"
            return f"{field}[{i}] differs: got {name(a)!r}, want {name(b)!r}"
    if len(got) != len(want):
        return f"{field}: got {len(got)} entries, want {len(want)}"
    return None


def graph_difference(got: onnx.GraphProto, want: onnx.GraphProto) -> str | None:
    """None when the two graphs serialize to the same bytes, else where they first differ."""
    if got.SerializeToString() == want.SerializeToString():
        return None
    def describe(n):
        return f"{n.domain}::{n.op_type} {n.name} {list(n.input)} -> {list(n.output)}"

    for field, name in (("node", describe), ("input", lambda v: v.name), ("output", lambda v: v.name),
                        ("initializer", lambda t: t.name), ("value_info", lambda v: v.name),
                        ("metadata_props", lambda p: f"{p.key}={p.value[:120]}")):
        message = _first_difference(list(getattr(got, field)), list(getattr(want, field)), field, name)
        if message:
            return message
    return "the graphs differ outside nodes, inputs, outputs, initializers, value_info and metadata"


def assert_same_graph(got: onnx.GraphProto, want: onnx.GraphProto) -> None:
    message = graph_difference(got, want)
    assert message is None, message


def machine_paths_in(path: Path) -> list[str]:
    """Where `path`'s file names the machine that exported it: node metadata the exporter fills
    with stack traces (gdn_export.onnx.export.MACHINE_METADATA), or the absolute folders of
    gdn_export and torch anywhere in its bytes."""
    import gdn_export
    import torch

    from gdn_export.onnx.export import MACHINE_METADATA

    data = Path(path).read_bytes()
    model = onnx.load_from_string(data)
    found = [f"{n.name}: {p.key}" for n in model.graph.node for p in n.metadata_props if p.key in MACHINE_METADATA]
    for package in (gdn_export, torch):
        folder = str(Path(package.__file__).resolve().parent.parent)
        if folder.encode() in data:
            found.append(folder)
    return found[:5]
