"""What every `gdn` op's ONNX module shares: the domain version, the plugin-identity attributes that
TensorRT's parser reads, and the small TypeProto helpers their shape-inference functions use."""

from __future__ import annotations

import onnx

# Version of every op inside the "gdn" ONNX domain (the model's opset_import entry).
DOMAIN_VERSION = 1
ATTR_PLUGIN_VERSION = "plugin_version"
ATTR_PLUGIN_NAMESPACE = "plugin_namespace"
ACTIVATION_TYPES = ("tensor(float)", "tensor(float16)", "tensor(bfloat16)")


def node_attributes(plugin_version: str, plugin_namespace: str, fields: dict[str, int]):
    """(NODE_ATTRIBUTES, NODE_ATTRIBUTE_VALUES) of a gdn node: every attribute and its type (TensorRT
    turns all but the two plugin_* strings into PluginFields of the same name), and the values the
    plugin_* strings must have."""
    attributes = {ATTR_PLUGIN_VERSION: onnx.AttributeProto.STRING,
                  ATTR_PLUGIN_NAMESPACE: onnx.AttributeProto.STRING, **fields}
    return attributes, {ATTR_PLUGIN_VERSION: plugin_version, ATTR_PLUGIN_NAMESPACE: plugin_namespace}


def dim(type_proto: onnx.TypeProto, axis: int) -> onnx.TensorShapeProto.Dimension | None:
    """Dimension `axis` of a tensor type, None when the shape or the axis is unknown."""
    tt = type_proto.tensor_type
    if not tt.HasField("shape") or len(tt.shape.dim) <= axis:
        return None
    return tt.shape.dim[axis]


def static(d) -> int | None:
    """A dimension's value when it is a number, else None."""
    return d.dim_value if d is not None and d.HasField("dim_value") else None


def rank(type_proto: onnx.TypeProto) -> int | None:
    tt = type_proto.tensor_type
    return len(tt.shape.dim) if tt.HasField("shape") else None


def tensor_type(elem_type: int, dims) -> onnx.TypeProto:
    """A tensor type; the shape is left unknown unless every dim is known or symbolic."""
    out = onnx.TypeProto()
    out.tensor_type.elem_type = elem_type
    if all(d is not None for d in dims):
        shape = out.tensor_type.shape
        for d in dims:
            shape.dim.add().CopyFrom(d)
    return out


def register_once(name: str, domain: str, make_schema) -> None:
    """Register make_schema() with the `onnx` package once (checker, shape inference, onnxscript)."""
    if not onnx.defs.has(name, DOMAIN_VERSION, domain):
        onnx.defs.register_schema(make_schema())
