"""Run an FP8 K/V cache graph in ONNX Runtime's CPU provider (in memory; the file is never changed).

The exported graph (docs/quantization.md, "FP8 K/V cache") keeps the cache in FLOAT8E4M3FN:

    update -> QuantizeLinear(s) -> TensorScatter(past FLOAT8E4M3FN) -> present -> DequantizeLinear(s) -> Attention

What ONNX Runtime 1.32's CPU provider lacks (measured on tiny graphs, onnxruntime 1.32.0):
* TensorScatter has no FLOAT8E4M3FN kernel ("Could not find an implementation for TensorScatter(24)");
* its Python API cannot feed or fetch float8 arrays (numpy has no float8: "Numpy_type 259 can't be
  converted to MLDataType"; OrtValue.ortvalue_from_numpy refuses ml_dtypes' float8_e4m3fn).
It runs Cast to / from FLOAT8E4M3FN and QuantizeLinear / DequantizeLinear of FLOAT8E4M3FN. So
`emulate_fp8_cache` rewrites each FP8 cache to the same values in another placement:

    past (FLOAT holding e4m3 values) -> Cast(FLOAT8E4M3FN) -> DequantizeLinear(s) ─┐
    update -> QuantizeLinear(s) -> DequantizeLinear(s) ──────────────── TensorScatter (FLOAT)
        -> QuantizeLinear(s) -> present8 -> Cast(FLOAT) -> present (FLOAT holding e4m3 values)
                                present8 -> DequantizeLinear(s) -> Attention (unchanged)

Exact: an e4m3 value times s, divided by s in fp32, rounds back to the same e4m3 value (the fp32
error, 2^-23 relative, is far below half an e4m3 step, 2^-4), so every cache slot holds what the
FLOAT8 graph stores. The runner's cache arrays are then fp32 arrays of e4m3 values (unscaled), as
the PyTorch runner's states_to_numpy gives them.
"""

from __future__ import annotations

import onnx
from onnx import helper

F8 = onnx.TensorProto.FLOAT8E4M3FN
FLOAT = onnx.TensorProto.FLOAT


def has_fp8_cache(model: onnx.ModelProto) -> bool:
    """Whether any graph input is FLOAT8E4M3FN (an FP8 K/V cache)."""
    return any(v.type.tensor_type.elem_type == F8 for v in model.graph.input)


def emulate_fp8_cache(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of model with FLOAT graph inputs / outputs for its FLOAT8E4M3FN caches and FLOAT
    TensorScatters (module docstring). Raises ValueError when a float8 TensorScatter's update does
    not come from a QuantizeLinear (not a graph gdn-export wrote)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    producer = {o: n for n in g.node for o in n.output}
    fp8_in = [v for v in g.input if v.type.tensor_type.elem_type == F8]
    fp8_out = {v.name for v in g.output if v.type.tensor_type.elem_type == F8}
    if not fp8_in and not fp8_out:
        return out
    rename = {}
    head = []
    for v in fp8_in:
        inner = v.name + "__fp8"
        rename[v.name] = inner
        head.append(helper.make_node("Cast", [v.name], [inner], to=F8, name=v.name + "__to_fp8"))
        v.type.tensor_type.elem_type = FLOAT
    nodes = []
    for n in g.node:
        for i, name in enumerate(n.input):
            if name in rename:
                n.input[i] = rename[name]
        if n.op_type == "TensorScatter" and n.output[0] in fp8_out:
            q = producer.get(n.input[1])
            if q is None or q.op_type != "QuantizeLinear":
                raise ValueError(f"{n.name}: the float8 cache update does not come from a QuantizeLinear")
            scale = list(q.input[1:2])
            tag = n.output[0]
            nodes += [
                helper.make_node("DequantizeLinear", [n.input[0], *scale], [tag + "__past_f"], name=tag + "__dq_past"),
                helper.make_node("DequantizeLinear", [n.input[1], *scale], [tag + "__upd_f"], name=tag + "__dq_upd"),
                helper.make_node("TensorScatter", [tag + "__past_f", tag + "__upd_f", n.input[2]], [tag + "__f"],
                                 name=n.name, **{a.name: helper.get_attribute_value(a) for a in n.attribute}),
                helper.make_node("QuantizeLinear", [tag + "__f", *q.input[1:]], [tag + "__fp8"], name=tag + "__q",
                                 **{a.name: helper.get_attribute_value(a) for a in q.attribute}),
            ]
            continue
        nodes.append(n)
    # graph outputs: the float8 tensor renamed, consumers rewired, a Cast(FLOAT) to the output name
    tail = []
    for name in fp8_out:
        inner = name + "__fp8"
        for n in nodes:
            if name in n.output and not n.output[0].endswith("__fp8"):
                n.output[list(n.output).index(name)] = inner
            for i, x in enumerate(n.input):
                if x == name:
                    n.input[i] = inner
        tail.append(helper.make_node("Cast", [inner], [name], to=FLOAT, name=name + "__to_float"))
    for v in g.output:
        if v.name in fp8_out:
            v.type.tensor_type.elem_type = FLOAT
    del g.node[:]
    g.node.extend(head + nodes + tail)
    return out
