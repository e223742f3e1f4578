"""Export one gdn op alone (a module that only calls it) and run it in ONNX Runtime."""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch

from gdn_export.onnx import attach_reference_functions
from gdn_export.onnx.schemas import custom_translation_table


def export_single_op(module: torch.nn.Module, args: tuple, dynamic_shapes, input_names,
                     opset: int = 18) -> onnx.ModelProto:
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module.eval(), args, dynamo=True, dynamic_shapes=dynamic_shapes,
            input_names=list(input_names), opset_version=opset,
            custom_translation_table=custom_translation_table(), verbose=False,
        )
    return program.model_proto


GDR_INPUTS = ("q", "k", "v", "g", "beta", "initial_state")


def export_gdr_op(module: torch.nn.Module, x: dict[str, torch.Tensor]) -> onnx.ModelProto:
    """`module` (a gated-delta-rule op on q, k, v, g, beta, initial_state) exported with the example
    inputs `x`: batch and seq dynamic in the five per-token inputs, batch in the state."""
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    dyn = ({0: batch, 1: seq},) * 5 + ({0: batch},)
    return export_single_op(module, tuple(x[n] for n in GDR_INPUTS), dyn, GDR_INPUTS)


def ort_session(model: onnx.ModelProto, form: str = "gdn") -> ort.InferenceSession:
    """A CPU session on `model` (gdn nodes): through the function bodies, or ("ort") rewritten to
    the ort form (gdn_export.onnx.ort_form.to_ort), which runs on ORT's own kernels."""
    if form == "ort":
        from gdn_export.onnx.ort_form import to_ort

        full = to_ort(model)
    else:
        full = attach_reference_functions(model)
    return ort.InferenceSession(full.SerializeToString(), providers=["CPUExecutionProvider"])


def run(session: ort.InferenceSession, feeds: dict[str, torch.Tensor]) -> list[np.ndarray]:
    """Run with the torch tensors of `feeds` (only the graph's inputs are passed)."""
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v.numpy() for k, v in feeds.items() if k in names})


def output_dims(model: onnx.ModelProto) -> list[list[int | str]]:
    """Output shapes after strict shape inference, dims as ints or dim_param strings."""
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    return [[d.dim_param if d.HasField("dim_param") else d.dim_value for d in o.type.tensor_type.shape.dim]
            for o in inferred.graph.output]


def gdn_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == "gdn"]


def attributes(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
