"""The GDN layers in standard ONNX: gdn nodes <-> opset-27 LinearAttention / CausalConvWithState.

    to_standard(model, domain="")      every gdn.GatedDeltaRule / gdn.CausalConv1d node -> a block of
                                       standard nodes around one LinearAttention / CausalConvWithState
                                       (domain "" for the opset-27 ops, "com.microsoft" for ONNX
                                       Runtime's contrib kernels of the same names)
    to_gdn(model)                      the exact inverse: every block back to the gdn node it records
    retarget(model, domain)            move existing LinearAttention / CausalConvWithState nodes to
                                       another domain (opset-27 <-> com.microsoft: same attributes)

Block semantics (docs/onnx.md, "Standard ONNX ops"): math in fp32 (inputs Cast to fp32, outputs Cast back
to the model dtype / the recurrent state's storage dtype once per call), q / k L2 norm and grouped
value heads (q, k repeated to Hv heads) in standard ops, the conv's new state gathered at each row's
last real token (seq_lens) instead of the op's own present_state. Every node of a block carries the
node metadata `gdn_export.block` (a block id); the LinearAttention / CausalConvWithState node also
carries `gdn_export.gdn_node` (the serialized gdn NodeProto), which `to_gdn` restores. The block's
inputs and outputs are the gdn node's own tensor names, so the graph around it is unchanged.
"""

from __future__ import annotations

import base64
import contextlib
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from gdn_export.errors import GdnExportError
from gdn_export.onnx.forms import KEY_BLOCK, KEY_ONNX_OPS, MS_DOMAIN, STANDARD, form_of
from gdn_export.onnx.rewrite import (Block, default_opset, gdr_fields, l2norm, meta, set_metadata,
                                     set_opset, static_dims)
from gdn_export.ops.causal_conv1d import ACTIVATION_SILU
from gdn_export.ops.causal_conv1d import PLUGIN_NAME as CONV_NAME
from gdn_export.ops.gated_delta_rule import PLUGIN_NAME as GDR_NAME
from gdn_export.ops.gated_delta_rule.naive import L2NORM_EPS
from gdn_export.onnx.schemas import DOMAIN as GDN_DOMAIN

STANDARD_OPSET = 27  # LinearAttention, CausalConvWithState entered the default domain here
LINEAR_ATTENTION, CAUSAL_CONV = "LinearAttention", "CausalConvWithState"
STANDARD_OPS = (LINEAR_ATTENTION, CAUSAL_CONV)
KEY_GDN_NODE = "gdn_export.gdn_node"
# Model metadata_props of a standard-form file: the default opset of its gdn form.
KEY_GDN_OPSET = "gdn_export.gdn_opset"
IR_VERSION_27 = 13  # the IR version onnx 1.23 pairs with opset 27

__all__ = ["STANDARD_OPSET", "form_of", "retarget", "to_gdn", "to_standard"]


def _block(block_id: str) -> Block:
    return Block(block_id, KEY_BLOCK)


def _gdr_block(node: onnx.NodeProto, types, block_id: str, domain: str) -> Block:
    """gdn.GatedDeltaRule(q, k, v, g, beta, s0) -> (o, final_state) as a LinearAttention block."""
    q, k, v, g, beta, s0 = node.input
    o, final = node.output
    _, hk, hv, _, dv, scale, l2 = gdr_fields(node, types, LINEAR_ATTENTION)
    v_type = types[v].tensor_type.elem_type
    s_type = types[s0].tensor_type.elem_type
    b = _block(block_id)
    f32 = TensorProto.FLOAT
    qf, kf, vf, bf, sf = (b.cast(x, f32) for x in (q, k, v, beta, s0))
    gf = b.cast(g, f32)
    if l2:
        last = b.const(np.array([-1], np.int64), "last")
        eps = b.const(np.array(L2NORM_EPS, np.float32), "eps")
        qf, kf = l2norm(b, qf, last, eps), l2norm(b, kf, last, eps)
    packed = b.const(np.array([0, 0, -1], np.int64), "packed")
    if hv != hk:  # repeat each key head m = Hv / Hk times: value head h reads key head h // m
        ax3 = b.const(np.array([3], np.int64), "ax3")
        reps = b.const(np.array([1, 1, 1, hv // hk, 1], np.int64), "reps")
        qf, kf = (b.add("Expand", [b.add("Unsqueeze", [x, ax3]), reps]) for x in (qf, kf))
    q3, k3, v3 = (b.add("Reshape", [x, packed]) for x in (qf, kf, vf))
    o3, s_out = b.add(LINEAR_ATTENTION, [q3, k3, v3, sf, gf, bf],
                      [b.name("output"), b.name("present_state")], domain=domain,
                      q_num_heads=hv, kv_num_heads=hv, scale=scale, update_rule="gated_delta")
    la = b.nodes[-1]
    la.metadata_props.add(key=KEY_GDN_NODE, value=base64.b64encode(node.SerializeToString()).decode())
    o4 = b.add("Reshape", [o3, b.const(np.array([0, 0, hv, dv], np.int64), "heads")])
    b.add("Cast", [o4], [o], to=v_type)
    b.add("Cast", [s_out], [final], to=s_type)
    return b


def _conv_block(node: onnx.NodeProto, types, block_id: str, domain: str) -> Block:
    """gdn.CausalConv1d(x, weight, bias, state, seq_lens) -> (y, new_state) as a CausalConvWithState
    block; the new state is gathered at each row's last real token."""
    x, weight, bias, state, seq_lens = node.input
    y, new_state = node.output
    what = f"{node.domain}.{node.op_type} node {node.name!r}"
    _, k = static_dims(types, weight, 2, what)
    if k is None or k < 2:
        raise GdnExportError(f"cannot rewrite {what}: the kernel width must be static and >= 2, got {k}")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    x_type = types[x].tensor_type.elem_type
    b = _block(block_id)
    f32 = TensorProto.FLOAT
    xf, wf, bf, sf = (b.cast(t, f32) for t in (x, weight, bias, state))
    x_ct = b.add("Transpose", [xf], perm=[0, 2, 1])
    w3 = b.add("Unsqueeze", [wf, b.const(np.array([1], np.int64), "ax1")])
    y_ct, _ = b.add(CAUSAL_CONV, [x_ct, w3, bf, sf], [b.name("output"), b.name("present_state")],
                    domain=domain, activation="silu" if attrs["activation"] == ACTIVATION_SILU else "none")
    b.nodes[-1].metadata_props.add(key=KEY_GDN_NODE,
                                   value=base64.b64encode(node.SerializeToString()).decode())
    b.add("Cast", [b.add("Transpose", [y_ct], perm=[0, 2, 1])], [y], to=x_type)
    # new_state[b, c, i] = concat(state, x)[b, c, L_b + i], L_b = clamp(seq_lens_b, 0, T).
    xs = b.add("Concat", [sf, x_ct], axis=2)
    t = b.add("Shape", [x], start=1, end=2)
    lens = b.add("Min", [b.add("Max", [b.cast(seq_lens, TensorProto.INT64),
                                      b.const(np.array([0], np.int64), "zero")]), t])
    cols = b.const(np.arange(k - 1, dtype=np.int64)[None, None, :], "cols")       # [1, 1, K-1]
    lens3 = b.add("Unsqueeze", [lens, b.const(np.array([1, 2], np.int64), "ax12")])  # [B, 1, 1]
    index = b.add("Add", [lens3, cols])                                               # [B, 1, K-1]
    shape = b.add("Concat", [b.add("Shape", [x], start=0, end=1), b.add("Shape", [x], start=2, end=3),
                             b.const(np.array([k - 1], np.int64), "km1")], axis=0)
    tail = b.add("GatherElements", [xs, b.add("Expand", [index, shape])], axis=2)
    b.add("Cast", [tail], [new_state], to=x_type)
    return b


_BUILDERS = {GDR_NAME: _gdr_block, CONV_NAME: _conv_block}


def to_standard(model: onnx.ModelProto, domain: str = "") -> onnx.ModelProto:
    """A copy of `model` (gdn form) whose GatedDeltaRule / CausalConv1d nodes are standard blocks.

    domain "": the opset-27 default-domain ops (the default opset is raised to 27, the IR version to
    13). domain "com.microsoft": ONNX Runtime's contrib ops (opset unchanged), for an in-memory
    session only. gdn.MoE nodes stay. GdnExportError when a node cannot be expressed (shapes unknown).
    """
    from gdn_export.onnx.rewrite import value_types

    types = value_types(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes, n_blocks = [], 0
    for node in model.graph.node:
        if node.domain == GDN_DOMAIN and node.op_type in _BUILDERS:
            nodes.extend(_BUILDERS[node.op_type](node, types, f"gdn_block{n_blocks}", domain).nodes)
            n_blocks += 1
        else:
            nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    if domain == "":
        gdn_opset = default_opset(model)
        opset = max(gdn_opset, STANDARD_OPSET)
        set_opset(out, "", opset)
        out.ir_version = max(out.ir_version, IR_VERSION_27)
        set_metadata(out, {KEY_ONNX_OPS: STANDARD, KEY_GDN_OPSET: str(gdn_opset),
                            "gdn_export.opset": str(opset)})
    else:
        set_opset(out, domain, 1)
    if not any(n.domain == GDN_DOMAIN for n in out.graph.node):
        set_opset(out, GDN_DOMAIN, None)
    return out


def retarget(model: onnx.ModelProto, domain: str) -> onnx.ModelProto:
    """A copy whose LinearAttention / CausalConvWithState nodes (in blocks) are in `domain`."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for node in out.graph.node:
        if node.op_type in STANDARD_OPS and KEY_BLOCK in meta(node):
            node.domain = domain
    if domain and not any(e.domain == domain for e in out.opset_import):
        out.opset_import.add(domain=domain, version=1)
    return out


def to_gdn(model: onnx.ModelProto, opset: int | None = None) -> onnx.ModelProto:
    """A copy of a standard-form `model` with every block replaced by the gdn node it records.

    `opset` (default: the one recorded in metadata_props `gdn_export.opset`, else unchanged) becomes
    the default opset again (metadata_props `gdn_export.gdn_opset`). GdnExportError when a block lacks its record (an edited file).
    """
    from gdn_export.onnx.schemas import DOMAIN_VERSION

    out = onnx.ModelProto()
    out.CopyFrom(model)
    records: dict[str, onnx.NodeProto] = {}
    for node in model.graph.node:
        props = meta(node)
        if KEY_GDN_NODE in props:
            gdn = onnx.NodeProto()
            gdn.ParseFromString(base64.b64decode(props[KEY_GDN_NODE]))
            records[props[KEY_BLOCK]] = gdn
    nodes, seen = [], set()
    for node in model.graph.node:
        block = meta(node).get(KEY_BLOCK)
        if block is None:
            nodes.append(node)
            continue
        if block not in records:
            raise GdnExportError(f"standard block {block!r} has no {KEY_GDN_NODE} record: the file was "
                                 f"edited after export; export it again")
        if block not in seen:
            seen.add(block)
            nodes.append(records[block])
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    if seen:
        set_opset(out, GDN_DOMAIN, DOMAIN_VERSION)
    if opset is None:
        recorded = {p.key: p.value for p in model.metadata_props}.get(KEY_GDN_OPSET)
        opset = int(recorded) if recorded else None
    if opset is not None:
        set_opset(out, "", opset)
        set_metadata(out, {KEY_ONNX_OPS: None, KEY_GDN_OPSET: None, "gdn_export.opset": str(opset)})
    for domain in ("", MS_DOMAIN):
        if domain and not any(n.domain == domain for n in out.graph.node):
            set_opset(out, domain, None)
    return out


def rewrite_file_to_standard(path, say=lambda _msg: None) -> None:
    """Rewrite the checked gdn-form file `path` into the standard form in place (weights in a
    sidecar stay where they are: only the graph changes), then check it (onnx.checker full_check,
    strict shape inference). The caller writes `path` in a temporary folder and renames it."""
    say("rewriting GatedDeltaRule / CausalConv1d to opset-27 LinearAttention / CausalConvWithState")
    proto = onnx.load(str(path), load_external_data=False)
    standard = to_standard(proto)
    onnx.save(standard, str(path))
    say("checking the standard form (onnx.checker full_check, strict shape inference)")
    onnx.checker.check_model(str(path), full_check=True)
    onnx.shape_inference.infer_shapes(standard, check_type=True, strict_mode=True)


@contextlib.contextmanager
def gdn_form_file(path, say=lambda _msg: None):
    """Yield a path whose file is `path` in the gdn form: `path` itself when it is one, else a
    temporary file beside it (its weights sidecar, if any, is shared: same folder, same relative
    name) holding to_gdn of its graph, removed on exit. For TensorRT, whose parser maps gdn nodes
    to our plugins and does not import the opset-27 ops."""
    path = Path(path)
    proto = onnx.load(str(path), load_external_data=False)
    if form_of(proto) != STANDARD:
        yield path
        return
    say("standard form: LinearAttention / CausalConvWithState blocks rewritten to gdn nodes for the plugins")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".gdn.onnx", dir=path.parent)
    os.close(fd)
    try:
        onnx.save(to_gdn(proto), tmp)
        yield Path(tmp)
    finally:
        Path(tmp).unlink(missing_ok=True)
