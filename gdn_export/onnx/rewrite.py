"""What the graph rewrites of the exported file share (standard_ops: opset-27 blocks; ort_form:
ONNX Runtime's compact ops): node metadata, opset and metadata_props edits, tensor types from shape
inference, and `Block`, the nodes that stand for one rewritten gdn node."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from gdn_export.errors import GdnExportError


def meta(node: onnx.NodeProto) -> dict[str, str]:
    """A node's metadata_props as a dict."""
    return {p.key: p.value for p in node.metadata_props}


def default_opset(model: onnx.ModelProto) -> int:
    for e in model.opset_import:
        if e.domain in ("", "ai.onnx"):
            return e.version
    raise GdnExportError("model has no opset_import entry for the default ONNX domain")


def set_opset(model: onnx.ModelProto, domain: str, version: int | None) -> None:
    """Set (version) or drop (None) the opset_import entry of `domain`."""
    keep = [e for e in model.opset_import if e.domain != domain and not (domain == "" and e.domain == "ai.onnx")]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    if version is not None:
        model.opset_import.add(domain=domain, version=version)


def set_metadata(model: onnx.ModelProto, values: dict[str, str | None]) -> None:
    """Set (str) or remove (None) model metadata_props entries."""
    props = {p.key: p.value for p in model.metadata_props}
    props.update(values)
    del model.metadata_props[:]
    for key, value in props.items():
        if value is not None:
            model.metadata_props.add(key=key, value=value)


def inferred_types(model: onnx.ModelProto, what: str = "shape inference failed on the graph") -> dict[str, onnx.TypeProto]:
    """Type of every graph input, output and node output of the main graph that shape inference
    (the gdn and com.microsoft schemas registered) can tell; GdnExportError "`what` (reason)"."""
    from gdn_export.onnx.schemas import register_schemas

    register_schemas()
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, ValueError) as exc:
        raise GdnExportError(f"{what} ({exc})") from None
    g = inferred.graph
    return {v.name: v.type for v in (*g.input, *g.output, *g.value_info)}


def value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """inferred_types and the initializers' types: every tensor of the main graph."""
    types = inferred_types(model)
    for init in model.graph.initializer:
        t = onnx.TypeProto()
        t.tensor_type.elem_type = init.data_type
        for d in init.dims:
            t.tensor_type.shape.dim.add().dim_value = d
        types[init.name] = t
    return types


def gdr_fields(node: onnx.NodeProto, types, op: str) -> tuple[str, int, int, int, int, float, bool]:
    """(what, Hk, Hv, Dk, Dv, scale, use_qk_l2norm) of a gdn.GatedDeltaRule `node` rewritten to `op`;
    GdnExportError unless its heads and head sizes are static with Hv a multiple of Hk and its scale
    is not 0 (which would mean 1/sqrt(Dk) to `op`)."""
    from gdn_export.ops.gated_delta_rule import FIELD_SCALE, FIELD_USE_QK_L2NORM

    q, v = node.input[0], node.input[2]
    what = f"{node.domain}.{node.op_type} node {node.name!r}"
    _, _, hk, dk = static_dims(types, q, 4, what)
    _, _, hv, dv = static_dims(types, v, 4, what)
    if None in (hk, hv, dk, dv) or hv % hk:
        raise GdnExportError(f"cannot rewrite {what}: heads / head sizes must be static with Hv a "
                             f"multiple of Hk (q heads {hk}, v heads {hv}, Dk {dk}, Dv {dv})")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    scale = float(attrs[FIELD_SCALE])
    if scale == 0.0:
        raise GdnExportError(f"cannot rewrite {what}: scale 0 means 1/sqrt(Dk) to {op}")
    return what, hk, hv, dk, dv, scale, bool(attrs[FIELD_USE_QK_L2NORM])


def static_dims(types, name: str, rank: int, what: str) -> list[int | None]:
    """The dims of tensor `name` (None where symbolic); GdnExportError naming `what` when its
    shape is unknown or of another rank."""
    t = types.get(name)
    if t is None or not t.tensor_type.HasField("shape") or len(t.tensor_type.shape.dim) != rank:
        raise GdnExportError(f"cannot rewrite {what}: the shape of {name!r} is unknown")
    return [d.dim_value if d.HasField("dim_value") else None for d in t.tensor_type.shape.dim]


class Block:
    """Nodes of one rewritten gdn node, each tagged (node metadata `key`) with the block id."""

    def __init__(self, block_id: str, key: str):
        self.id, self.key, self.nodes, self._n = block_id, key, [], 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{self.id}/{hint}_{self._n}"

    def add(self, op: str, inputs, outputs=None, domain: str = "", **attrs) -> str | list[str]:
        outputs = outputs or [self.name(op.lower())]
        node = helper.make_node(op, list(inputs), list(outputs), name=self.name(op), domain=domain, **attrs)
        node.metadata_props.add(key=self.key, value=self.id)
        self.nodes.append(node)
        return outputs[0] if len(outputs) == 1 else outputs

    def const(self, array: np.ndarray, hint: str) -> str:
        return self.add("Constant", [], [self.name(hint)],
                        value=onnx.numpy_helper.from_array(np.asarray(array), self.name(hint)))

    def cast(self, x: str, to: int) -> str:
        return self.add("Cast", [x], to=to)


def l2norm(b: Block, x: str, axis_last: str, eps: str) -> str:
    """x / sqrt(sum(x^2, last axis) + eps) in standard ops (x fp32; `axis_last` [-1], `eps` scalar)."""
    sq = b.add("Mul", [x, x])
    ss = b.add("ReduceSum", [sq, axis_last], keepdims=1)
    return b.add("Div", [x, b.add("Sqrt", [b.add("Add", [ss, eps])])])
