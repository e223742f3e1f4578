"""Run a bf16 graph on ONNX Runtime's CPU provider (no bf16 kernels) computing what it computes.

`emulate_bf16(model)` returns an in-memory copy in which every bf16 tensor is an fp32 tensor that
holds a bf16 value: bf16 initializers become fp32 (exact), bf16 graph inputs / outputs fp32, and
every node output that the bf16 graph stores in bf16 is rounded where the graph rounds it, by
`Cast(to=BFLOAT16)` then `Cast(to=FLOAT)` (ORT's CPU Cast rounds to nearest even, like torch).
Nodes that name bf16 themselves (Cast to, ConstantOfShape / Constant values) are rewritten to fp32
and rounded the same way. So each op computes in fp32 on inputs that are exactly the bf16 graph's
and rounds its output as the bf16 graph stores it: the bf16 graph's arithmetic up to each kernel's
internal precision (a bf16 runtime accumulates in fp32 too). The exported file is never changed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from gdn_export.errors import GdnExportError

BF16, F32 = TensorProto.BFLOAT16, TensorProto.FLOAT
ROUND_SUFFIX = "/unrounded_bf16"


def has_bf16(model: onnx.ModelProto) -> bool:
    """Whether any graph input, output or initializer of `model` is bf16, or any node casts to it."""
    g = model.graph
    if any(v.type.tensor_type.elem_type == BF16 for v in (*g.input, *g.output)):
        return True
    if any(t.data_type == BF16 for t in g.initializer):
        return True
    return any(n.op_type == "Cast" and any(a.name == "to" and a.i == BF16 for a in n.attribute)
               for n in g.node)


def _to_fp32_tensor(t: onnx.TensorProto) -> onnx.TensorProto:
    arr = numpy_helper.to_array(t).astype(np.float32)
    out = numpy_helper.from_array(arr, t.name)
    return out


def _output_types(model: onnx.ModelProto) -> dict[str, int]:
    from gdn_export.onnx.rewrite import inferred_types

    types = inferred_types(model, "bf16 emulation: shape inference failed")
    return {name: t.tensor_type.elem_type for name, t in types.items()}


def emulate_bf16(model: onnx.ModelProto) -> onnx.ModelProto:
    """The fp32-with-bf16-rounding copy of `model` (see module docstring). Models with external
    data must have it loaded. Every node output whose type is unknown to shape inference keeps
    its (fp32) value unrounded, so GdnExportError is raised when a node output's type is unknown
    and the node has a bf16 input in the original graph."""
    types = _output_types(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for i, init in enumerate(g.initializer):
        if init.data_type == BF16:
            g.initializer[i].CopyFrom(_to_fp32_tensor(init))
    for v in (*g.input, *g.output, *g.value_info):
        if v.type.tensor_type.elem_type == BF16:
            v.type.tensor_type.elem_type = F32
    nodes = []
    for node in g.node:
        node = _fp32_attributes(node)
        rounded = []
        for j, name in enumerate(node.output):
            if name and types.get(name) == BF16:
                node.output[j] = name + ROUND_SUFFIX
                rounded.append(name)
            elif name and name not in types and any(types.get(x) == BF16 for x in node.input):
                raise GdnExportError(f"bf16 emulation: the type of {name!r} ({node.op_type}) is unknown")
        nodes.append(node)
        for name in rounded:
            mid = name + "/bf16"
            nodes.append(helper.make_node("Cast", [name + ROUND_SUFFIX], [mid], to=BF16,
                                          name=name + "/round_bf16"))
            nodes.append(helper.make_node("Cast", [mid], [name], to=F32, name=name + "/back_fp32"))
    del g.node[:]
    g.node.extend(nodes)
    return out


def _fp32_attributes(node: onnx.NodeProto) -> onnx.NodeProto:
    """A copy of `node` with its bf16-naming attributes set to fp32 (Cast to, tensor values)."""
    new = onnx.NodeProto()
    new.CopyFrom(node)
    for attr in new.attribute:
        if new.op_type == "Cast" and attr.name == "to" and attr.i == BF16:
            attr.i = F32
        elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == BF16:
            attr.t.CopyFrom(_to_fp32_tensor(attr.t))
    return new
