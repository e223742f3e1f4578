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


def make_op_schema(name: str, domain: str, doc: str, inputs, outputs, type_constraints, attributes,
                   infer) -> onnx.defs.OpSchema:
    """The OpSchema of one gdn node (version DOMAIN_VERSION) with shape inference `infer`.

    inputs / outputs: (name, type string, description) each; type_constraints as OpSchema takes
    them; attributes: (name, OpSchema.AttrType, description) of the op's own fields, after which
    the two plugin-identity strings every gdn node carries are added."""
    P = onnx.defs.OpSchema.FormalParameter
    A = onnx.defs.OpSchema.Attribute
    string = onnx.defs.OpSchema.AttrType.STRING
    schema = onnx.defs.OpSchema(
        name, domain, DOMAIN_VERSION, doc,
        inputs=[P(*i) for i in inputs], outputs=[P(*o) for o in outputs],
        type_constraints=type_constraints,
        attributes=[A(ATTR_PLUGIN_VERSION, string, "TensorRT plugin version"),
                    A(ATTR_PLUGIN_NAMESPACE, string, "TensorRT plugin namespace"),
                    *(A(*a) for a in attributes)],
    )
    schema.set_type_and_shape_inference_function(infer)
    return schema


def plugin_node(name: str, domain: str, version: str, namespace: str, *inputs, **fields):
    """One gdn node in an onnxscript translation: `name` of `domain` on `inputs`, with the plugin
    identity (version, namespace) and the op's own attribute `fields`; returns its outputs."""
    import onnxscript

    opset = onnxscript.values.Opset(domain, DOMAIN_VERSION)
    return getattr(opset, name)(*inputs, plugin_version=version, plugin_namespace=namespace, **fields)


def function_text(template: str, *, domain: str, opset: int, name: str, fields, inputs, outputs,
                  **values) -> str:
    """A reference function's ONNX text: `template` with its header filled in (domain, default
    opset, name, the attributes: the op's `fields` and the plugin identity, inputs, outputs) and
    the op's own `values`."""
    return template.format(domain=domain, opset=opset, name=name,
                           attrs=", ".join((*fields, ATTR_PLUGIN_VERSION, ATTR_PLUGIN_NAMESPACE)),
                           inputs=", ".join(inputs), outputs=", ".join(outputs), **values)


def unshape_loop_values(fn: onnx.FunctionProto, keep: set[str]) -> onnx.FunctionProto:
    """The text format writes a Loop body's `float x` as a scalar: clear the shapes of its inputs
    and outputs, all but `keep` (the iteration counter and condition)."""
    for node in fn.node:
        if node.op_type == "Loop":
            graph = node.attribute[0].g
            for value in list(graph.input) + list(graph.output):
                if value.name not in keep:
                    value.type.tensor_type.ClearField("shape")
    return fn
