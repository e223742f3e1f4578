"""Check that an exported graph is exactly what TensorRT's ONNX parser maps to the gdn plugins.

TensorRT maps a node to a plugin when its op_type is a registered plugin name; it reads the
plugin_version / plugin_namespace string attributes and turns every other attribute into a
PluginField. So each gdn node must carry exactly the contract's attributes with the contract's
types, all inputs present, and nothing may hide behind a local function (TensorRT would inline
or reject it instead of calling the plugin). Failing here is a gdn-export bug, not a user error.
"""

from __future__ import annotations

from collections import Counter

import onnx

from gdn_export.onnx.schemas import DOMAIN, DOMAIN_VERSION, OP_MODULES

STANDARD_DOMAINS = ("", "ai.onnx")
# TensorRT 10.x parsers accept 17..21; TensorRT 10.15+ and TensorRT-RTX 1.7 parse 24 (TensorScatter).
MIN_OPSET, MAX_OPSET = 17, 24


class ExportCheckError(RuntimeError):
    """The exported graph breaks the gdn plugin contract (a bug in gdn-export)."""


def _walk(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _walk(attr.g)
            for g in attr.graphs:
                yield from _walk(g)


def _check_gdn_node(node: onnx.NodeProto, module) -> None:
    where = f"node {node.name!r} ({node.domain}.{node.op_type})"
    if len(node.input) != len(module.INPUT_NAMES) or any(not i for i in node.input):
        raise ExportCheckError(f"{where}: needs all {len(module.INPUT_NAMES)} inputs "
                               f"{module.INPUT_NAMES}, got {list(node.input)}")
    if len(node.output) != len(module.OUTPUT_NAMES):
        raise ExportCheckError(f"{where}: needs outputs {module.OUTPUT_NAMES}, got {list(node.output)}")
    got = {a.name: a for a in node.attribute}
    if set(got) != set(module.NODE_ATTRIBUTES):
        raise ExportCheckError(f"{where}: attributes must be {sorted(module.NODE_ATTRIBUTES)}, "
                               f"got {sorted(got)}")
    for name, kind in module.NODE_ATTRIBUTES.items():
        if got[name].type != kind:
            raise ExportCheckError(f"{where}: attribute {name} must be "
                                   f"{onnx.AttributeProto.AttributeType.Name(kind)}, got "
                                   f"{onnx.AttributeProto.AttributeType.Name(got[name].type)}")
    for name, value in module.NODE_ATTRIBUTE_VALUES.items():
        if got[name].s.decode() != value:
            raise ExportCheckError(f"{where}: {name} must be {value!r}, got {got[name].s.decode()!r}")


def _check_value_types(graph: onnx.GraphProto) -> None:
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        kind = value.type.WhichOneof("value")
        if kind not in (None, "tensor_type"):
            raise ExportCheckError(f"value {value.name!r} has type {kind}: TensorRT takes tensors only")


def check_plugin_mappable(model: onnx.ModelProto) -> Counter:
    """Raise ExportCheckError unless `model` is plugin-mappable; return {op_type: count} of gdn nodes."""
    if len(model.functions):
        names = [f"{f.domain}.{f.name}" for f in model.functions]
        raise ExportCheckError(f"exported file must hold no local functions, found {names}")
    opsets = {e.domain: e.version for e in model.opset_import}
    # A graph without gdn nodes (the MTP head of a dense model: attention and MLP only) may lack the domain.
    has_gdn = any(node.domain == DOMAIN for node in _walk(model.graph))
    if (has_gdn or DOMAIN in opsets) and opsets.get(DOMAIN) != DOMAIN_VERSION:
        raise ExportCheckError(f"opset_import must have {DOMAIN!r}: {DOMAIN_VERSION}, got {opsets}")
    default = opsets.get("", opsets.get("ai.onnx"))
    if default is None or not MIN_OPSET <= default <= MAX_OPSET:
        raise ExportCheckError(f"ai.onnx opset must be in [{MIN_OPSET}, {MAX_OPSET}], got {default}")
    extra = set(opsets) - {DOMAIN, *STANDARD_DOMAINS}
    if extra:
        raise ExportCheckError(f"unexpected opset domains {sorted(extra)}")
    _check_value_types(model.graph)
    by_name = {m.PLUGIN_NAME: m for m in OP_MODULES}
    counts: Counter = Counter()
    for node in _walk(model.graph):
        if node.domain in STANDARD_DOMAINS:
            if node.op_type in ("SequenceConstruct", "SequenceAt", "Optional", "OptionalGetElement"):
                raise ExportCheckError(f"node {node.name!r} uses {node.op_type}: not TensorRT-friendly")
            continue
        if node.domain != DOMAIN or node.op_type not in by_name:
            raise ExportCheckError(f"node {node.name!r} is {node.domain}.{node.op_type}: only standard "
                                   f"ONNX and {DOMAIN}.{{{', '.join(by_name)}}} may appear")
        _check_gdn_node(node, by_name[node.op_type])
        counts[node.op_type] += 1
    return counts
