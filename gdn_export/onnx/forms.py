"""The three ONNX forms of the GDN layers (`export --onnx-ops`, docs/onnx_forms.md) and how to tell
which one a file is.

    gdn       gdn.GatedDeltaRule / gdn.CausalConv1d nodes: what TensorRT's parser maps to our plugins
              (the default; ORT runs it through gdn_export.onnx.ort_native)
    standard  opset-27 LinearAttention / CausalConvWithState blocks (gdn_export.onnx.standard_ops)
    ort       ONNX Runtime's compact contrib ops: one com.microsoft.GatedDeltaNet per GDN layer,
              VarlenCausalConvWithState, GatedRMSNorm (gdn_export.onnx.ort_form); ONNX Runtime only

Every form has the same graph inputs, outputs and state layout, so each runner takes any of them;
metadata_props `gdn_export.onnx_ops` records a rewritten file's form.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gdn_export.errors import GdnExportError

if TYPE_CHECKING:  # the command line's parser imports FORMS: no onnx import at startup
    import onnx

GDN, STANDARD, ORT = "gdn", "standard", "ort"
FORMS = (GDN, STANDARD, ORT)
KEY_ONNX_OPS = "gdn_export.onnx_ops"
KEY_BLOCK = "gdn_export.block"  # node metadata: the standard block a node belongs to
MS_DOMAIN = "com.microsoft"
ORT_FORM_OP = "GatedDeltaNet"  # a com.microsoft node of this type makes a graph the ort form


def check_form(onnx_ops: str) -> str:
    """`onnx_ops` if it names a form, else GdnExportError."""
    if onnx_ops not in FORMS:
        raise GdnExportError(f"--onnx-ops {onnx_ops!r}: choose one of {', '.join(FORMS)}")
    return onnx_ops


def form_of(model: onnx.ModelProto) -> str:
    """"ort" when the graph holds com.microsoft.GatedDeltaNet nodes, "standard" when it holds
    LinearAttention / CausalConvWithState blocks, else "gdn"."""
    nodes = model.graph.node
    if any(n.domain == MS_DOMAIN and n.op_type == ORT_FORM_OP for n in nodes):
        return ORT
    if any(p.key == KEY_BLOCK for n in nodes for p in n.metadata_props):
        return STANDARD
    return GDN
