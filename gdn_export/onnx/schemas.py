"""Register the OpSchemas of the `gdn` ONNX domain with the `onnx` Python package.

onnx.checker, onnx.shape_inference and onnxscript (which the torch exporter uses to build the
custom nodes) all look ops up in the `onnx` package's schema registry; without these schemas a
gdn node is an unknown op to them. ONNX Runtime and TensorRT keep their own registries and do not
need this.
"""

from __future__ import annotations

from types import ModuleType

from gdn_export.ops.causal_conv1d import onnx as causal_conv1d_onnx
from gdn_export.ops.gated_delta_rule import onnx as gated_delta_rule_onnx
from gdn_export.ops.gated_delta_rule import onnx_steps as gated_delta_rule_steps_onnx
from gdn_export.ops.moe import onnx as moe_onnx
from gdn_export.ops.onnx_common import DOMAIN_VERSION  # noqa: F401  (the gdn domain's version)

# Every op of the gdn domain, as its ONNX contract module.
OP_MODULES: tuple[ModuleType, ...] = (gated_delta_rule_onnx, gated_delta_rule_steps_onnx, causal_conv1d_onnx, moe_onnx)
DOMAIN = gated_delta_rule_onnx.ONNX_DOMAIN


def register_schemas() -> None:
    """Register gdn.GatedDeltaRule, gdn.GatedDeltaRuleSteps, gdn.CausalConv1d and gdn.MoE, and the com.microsoft ops of the
    ort form (gdn_export.onnx.ort_form.schemas); a no-op when already registered."""
    from gdn_export.onnx.ort_form.schemas import register_schemas as register_ort_form

    for module in OP_MODULES:
        module.register_schema()
    register_ort_form()


def custom_translation_table() -> dict:
    """{torch op overload: onnxscript translation} for torch.onnx.export(..., dynamo=True)."""
    from gdn_export.ops.attention.onnx import translations
    from gdn_export.ops.quant_linear.onnx import translations as quant_translations
    from gdn_export.ops.moe_quant.onnx import translations as moe_quant_translations

    register_schemas()
    return {**{module.torch_target(): module.translation for module in OP_MODULES}, **translations(),
            **quant_translations(), **moe_quant_translations()}
