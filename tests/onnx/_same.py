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


def _tensor_key(t) -> tuple:
    array = t.numpy()
    return (str(t.dtype), tuple(t.shape), hashlib.sha256(array.tobytes()).hexdigest())


def _attr_key(a) -> tuple:
    import onnx_ir as ir

    value = a.value
    if a.type == ir.AttributeType.TENSOR:
        value = _tensor_key(value)
    elif a.type in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
        value = tuple(value)
    elif a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
        raise AssertionError("canonical_graph compares graphs without subgraphs")
    return (a.name, str(a.type), value)


def _type_key(v) -> tuple:
    shape = None if v.shape is None else tuple(str(d) for d in v.shape)
    return (str(v.type), shape)


def canonical_graph(model) -> dict:
    """An onnx_ir model's graph as a DAG without names: each value keyed by what makes it (a graph
    input by name, an initializer by dtype, shape and bytes, a node output by the node's key and its
    position), each node keyed by op, attributes, input keys and output types; node names, value
    names, metadata and the order of independent nodes left out. Two graphs are node for node the
    same (ops, attributes, wiring, value types, initializer bytes) when their canonical graphs are
    equal."""
    from collections import Counter

    g = model.graph
    key: dict[int, tuple] = {id(v): ("input", v.name) for v in g.inputs}
    inits = Counter()
    for v in g.initializers.values():
        key[id(v)] = ("init",) + _tensor_key(v.const_value)
        inits[key[id(v)]] += 1
    nodes, shown = Counter(), {}
    for n in g:  # the graph is sorted topologically
        ins = tuple(None if v is None else key[id(v)] for v in n.inputs)
        outs = tuple(_type_key(v) for v in n.outputs)
        digest = hashlib.sha256(repr((n.domain, n.op_type, n.overload,
                                      tuple(sorted(_attr_key(a) for a in n.attributes.values())),
                                      ins, outs)).encode()).hexdigest()
        for o, v in enumerate(n.outputs):
            key[id(v)] = ("node", digest, o)
        nodes[digest] += 1
        shown.setdefault(digest, f"{n.op_type} {n.name} ({', '.join('-' if v is None else str(v.name) for v in n.inputs)})")
    return {"inputs": tuple((v.name, _type_key(v)) for v in g.inputs),
            "outputs": tuple((v.name, key[id(v)], _type_key(v)) for v in g.outputs),
            "opsets": dict(g.opset_imports), "nodes": nodes, "initializers": inits, "shown": shown}


def canonical_difference(got, want) -> str | None:
    """None when the onnx_ir models `got` and `want` have the same canonical graph, else a line
    saying where they first differ (the first node of `got`, in its order, that `want` lacks)."""
    a, b = canonical_graph(got), canonical_graph(want)
    for field in ("inputs", "opsets"):
        if a[field] != b[field]:
            return f"{field} differ: got {a[field]}, want {b[field]}"[:600]
    if a["nodes"] != b["nodes"]:
        extra = [k for k in a["nodes"] if a["nodes"][k] > b["nodes"].get(k, 0)]
        missing = [k for k in b["nodes"] if b["nodes"][k] > a["nodes"].get(k, 0)]
        return (f"{len(extra)} node kinds more, {len(missing)} fewer than wanted; first extra: "
                f"{a['shown'][extra[0]] if extra else '-'}; first missing: {b['shown'][missing[0]] if missing else '-'}")
    if a["outputs"] != b["outputs"]:
        return "graph outputs are made differently: " + next(
            f"{x[0]}" for x, y in zip(a["outputs"], b["outputs"]) if x != y)
    if a["initializers"] != b["initializers"]:
        return (f"initializers differ: {sum(a['initializers'].values())} against "
                f"{sum(b['initializers'].values())}, values of the same count differ")
    return None
