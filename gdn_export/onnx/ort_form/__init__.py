"""The ort form (`export --onnx-ops ort`): the GDN layers as ONNX Runtime's compact contrib ops.

    to_ort(model)                 a copy of a gdn-form model whose GDN layers are com.microsoft ops
    rewrite_file_to_ort(path)     the same on a checked gdn-form file, in place (graph only), checked

Per GDN layer (docs/onnx_forms.md has the table):

* gdn.GatedDeltaRule -> one GatedDeltaNet on the rank-4 q / k / v as they are (token-major, grouped
  value heads native: value head h reads key head h // (Hv / Hk)), `scale` as given.
  - q / k L2 norm: in standard ops (fp32, then the model dtype), not the op's `qk_l2_norm`, whose
    epsilon is not our 1e-6 (measured: it matches eps 1e-12 or none).
  - the gate g = -exp(A_log) softplus(a + dt_bias): inside (`gate_activation` "qwen", which 1.32
    also calls softplus; a_log recovered from the exported constant -exp(A_log); dt_bias), fed the
    raw a; beta = sigmoid(b): inside (`beta_activation` sigmoid), fed the raw b. Both in fp32 inside
    the op, where the gdn form rounds a 16-bit sigmoid(b) to the model dtype first. Padded tokens
    of ragged rows get the lowest finite value as raw a and b: softplus and sigmoid make it
    exactly 0, an identity step.
    Where the exported chain is another (OLMo-Hybrid's beta = 2 sigmoid(b)), the computed g / beta.
  - the recurrent state: the op's is V-major fp32 [B, Hv, Dv, Dk]; the graph's stays
    [B, Hv, Dk, Dv] in its dtype (Transpose, and Cast for a 16-bit state, either side).
  - the output norm rmsnorm(o) w silu(z) -> one GatedRMSNorm (fp32 inside, rounded once).
* gdn.CausalConv1d -> one VarlenCausalConvWithState over the B*T tokens with cu_seqlens
  [0, T, .., B*T] (fp32 inside, rounded once; no Transpose); the new state of a ragged row is
  gathered at its last real token, as in the standard form.
* LinearAttentionGate is not used: the gate it fuses goes into GatedDeltaNet.

Graph inputs, outputs, states and metadata_props are the gdn form's (`gdn_export.onnx_ops` = ort);
gdn.MoE stays a gdn node. The rewrite drops what the fused ops replace, so the ort form does not go
back to the gdn form: TensorRT (`build`) refuses it by name. ONNX Runtime needs kernels of the
three ops (MIN_ORT_VERSION per provider; gdn_export.onnx.ort_native checks at load).
"""

from __future__ import annotations

from pathlib import Path

import onnx

from gdn_export.onnx.forms import KEY_ONNX_OPS, MS_DOMAIN, ORT
from gdn_export.onnx.ort_form.blocks import KEY_ORT_BLOCK, conv_block, gdr_block
from gdn_export.onnx.ort_form.patterns import GraphIndex
from gdn_export.onnx.ort_form.schemas import OPS, VERSION
from gdn_export.onnx.rewrite import Block, set_metadata, set_opset, value_types
from gdn_export.onnx.schemas import DOMAIN as GDN_DOMAIN
from gdn_export.ops.causal_conv1d import PLUGIN_NAME as CONV_NAME
from gdn_export.ops.gated_delta_rule import PLUGIN_NAME as GDR_NAME

_BUILDERS = {GDR_NAME: gdr_block, CONV_NAME: conv_block}
# The first release with kernels of OPS, per provider (read from the 1.31.1 / 1.32.0 wheels: 1.31.1
# has their schemas and CUDA kernels, CPU kernels of GatedRMSNorm only).
MIN_ORT_VERSION = {"CPUExecutionProvider": "1.32", "CUDAExecutionProvider": "1.31"}
__all__ = ["KEY_ORT_BLOCK", "MIN_ORT_VERSION", "OPS", "rewrite_file_to_ort", "to_ort"]


def prune(graph: onnx.GraphProto) -> None:
    """Remove the nodes whose outputs feed nothing (repeatedly), the initializers nothing reads and
    the value_info of tensors no node makes any more."""
    outputs = {v.name for v in graph.output}
    nodes = list(graph.node)
    while True:
        used = outputs | {i for n in nodes for i in n.input}
        keep = [n for n in nodes if any(o in used for o in n.output if o)]
        if len(keep) == len(nodes):
            break
        nodes = keep
    del graph.node[:]
    graph.node.extend(nodes)
    read = {i for n in nodes for i in n.input}
    inits = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    made = {o for n in nodes for o in n.output}
    infos = [v for v in graph.value_info if v.name in made]
    del graph.value_info[:]
    graph.value_info.extend(infos)


def to_ort(model: onnx.ModelProto, base_dir: str | Path | None = None) -> onnx.ModelProto:
    """A copy of gdn-form `model` in the ort form (module docstring). `base_dir`: where its external
    data lives, for constants the rewrite reads (the gate's). GdnExportError when a gdn node cannot
    be expressed (shapes unknown)."""
    types = value_types(model)
    index = GraphIndex(model.graph, base_dir)
    placed: dict[str, Block] = {}  # first output of a superseded node -> the nodes in its place
    gdn_nodes = [n for n in model.graph.node if n.domain == GDN_DOMAIN and n.op_type in _BUILDERS]
    for i, node in enumerate(gdn_nodes):
        placed.update(_BUILDERS[node.op_type](node, index, types, f"gdn_ort{i}"))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for node in model.graph.node:
        block = placed.get(node.output[0]) if node.output else None
        nodes.extend(block.nodes if block is not None else [node])
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    prune(out.graph)
    set_opset(out, MS_DOMAIN, VERSION)
    if not any(n.domain == GDN_DOMAIN for n in out.graph.node):
        set_opset(out, GDN_DOMAIN, None)
    set_metadata(out, {KEY_ONNX_OPS: ORT})
    return out


def rewrite_file_to_ort(path, say=lambda _msg: None) -> None:
    """Rewrite the checked gdn-form file `path` into the ort form in place (weights in a sidecar stay
    where they are: only the graph changes), then check it (onnx.checker full_check, strict shape
    inference). The caller writes `path` in a temporary folder and renames it."""
    path = Path(path)
    say(f"rewriting the GDN layers to com.microsoft {', '.join(OPS)} (ONNX Runtime's kernels)")
    proto = onnx.load(str(path), load_external_data=False)
    ort = to_ort(proto, base_dir=path.parent)
    onnx.save(ort, str(path))
    say("checking the ort form (onnx.checker full_check, strict shape inference)")
    onnx.checker.check_model(str(path), full_check=True)
    onnx.shape_inference.infer_shapes(ort, check_type=True, strict_mode=True)
