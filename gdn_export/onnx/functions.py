"""Attach standard-ONNX bodies of the gdn ops to a model, in memory, so ONNX Runtime can run it.

The exported file holds bare gdn.* nodes: exactly what TensorRT's ONNX parser maps to the gdn
plugins. ONNX Runtime has no such ops, but it executes a node whose (domain, op_type) names a
model-local FunctionProto by inlining the function body. `attach_reference_functions` adds those
bodies (a Loop over T for the gated delta rule, a windowed weighted sum for the conv), written
independently of the torch references, so ORT parity is a real second opinion and ORT needs no
compiled custom-op library. Never save the result over the exported file.
"""

from __future__ import annotations

import onnx

from gdn_export.onnx.schemas import DOMAIN, DOMAIN_VERSION, OP_MODULES


def default_opset(model: onnx.ModelProto) -> int:
    """The model's version of the default ("" / ai.onnx) domain."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    raise ValueError("model has no opset_import entry for the default ONNX domain")


def reference_functions(opset: int) -> list[onnx.FunctionProto]:
    """The FunctionProtos of every gdn op, written against ai.onnx version `opset`."""
    return [module.function_proto(opset) for module in OP_MODULES]


def attach_reference_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with the gdn function bodies added (existing ones are replaced).

    The input is not modified. Models with external data must have it loaded (the copy shares
    nothing with the input, so it is as large as the model).
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    functions = reference_functions(default_opset(model))
    ours = {(f.domain, f.name) for f in functions}
    kept = [f for f in out.functions if (f.domain, f.name) not in ours]
    del out.functions[:]
    out.functions.extend(kept + functions)
    if not any(e.domain == DOMAIN for e in out.opset_import):
        out.opset_import.add(domain=DOMAIN, version=DOMAIN_VERSION)
    return out
