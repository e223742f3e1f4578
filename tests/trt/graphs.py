"""A small hand-made ONNX graph holding both gdn custom nodes, built with onnx.helper only (no
exporter), so that engine building is tested independently of gdn_export.onnx.

    x [batch, seq, C] -> gdn.CausalConv1d (+ past.0.conv, seq_lens = seq per row) -> y
    y -> q = k (reshape), v (MatMul), beta = sigmoid, g = -softplus (fp32)
      -> gdn.GatedDeltaRule (+ past.0.recurrent fp32) -> o -> out (fp32)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

C, K, HK, HV, DK, DV = 32, 4, 2, 4, 16, 24
NAME_CONV, NAME_GDR = "conv_node", "gdr_node"


def _seq_lens_nodes(x: str, out: str) -> list:
    """`out` [batch] int32 = seq for every row of x [batch, seq, C], as the exporter emits the conv's
    row lengths without ragged rows."""
    return [
        helper.make_node("Shape", [x], [f"{out}_b"], name=f"{out}_batch", start=0, end=1),
        helper.make_node("Shape", [x], [f"{out}_t"], name=f"{out}_seq", start=1, end=2),
        helper.make_node("Cast", [f"{out}_t"], [f"{out}_t32"], name=f"{out}_int32", to=TensorProto.INT32),
        helper.make_node("Expand", [f"{out}_t32", f"{out}_b"], [out], name=out),
    ]


def make_plugin_graph(path: Path, dtype: int = TensorProto.FLOAT16, *, gdr_version: str = "1",
                      conv_version: str = "1") -> Path:
    """Write the graph to `path` with activations in `dtype` (TensorProto enum)."""
    rng = np.random.default_rng(0)
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)

    def init(name, array):
        if dtype == TensorProto.BFLOAT16:
            return helper.make_tensor(name, dtype, array.shape, array.astype(np.float32).flatten().tolist())
        return numpy_helper.from_array(array.astype(np_dtype), name)

    inits = [
        init("conv_w", rng.standard_normal((C, K)) * 0.3),
        init("conv_b", np.zeros(C)),
        init("w_v", rng.standard_normal((C, HV * DV)) * 0.1),
        init("w_g", rng.standard_normal((C, HV)) * 0.1),
        numpy_helper.from_array(np.array([0, 0, HK, DK], np.int64), "shape_qk"),
        numpy_helper.from_array(np.array([0, 0, HV, DV], np.int64), "shape_v"),
    ]
    nodes = [
        *_seq_lens_nodes("x", "seq_lens"),
        helper.make_node("CausalConv1d", ["x", "conv_w", "conv_b", "past.0.conv", "seq_lens"], ["y", "present.0.conv"],
                         name=NAME_CONV, domain="gdn", plugin_version=conv_version, plugin_namespace="gdn",
                         activation=1),
        helper.make_node("Reshape", ["y", "shape_qk"], ["q"], name="to_q"),
        helper.make_node("Identity", ["q"], ["k"], name="to_k"),
        helper.make_node("MatMul", ["y", "w_v"], ["v_flat"], name="proj_v"),
        helper.make_node("Reshape", ["v_flat", "shape_v"], ["v"], name="to_v"),
        helper.make_node("MatMul", ["y", "w_g"], ["gate"], name="proj_gate"),
        helper.make_node("Sigmoid", ["gate"], ["beta"], name="to_beta"),
        helper.make_node("Cast", ["gate"], ["gate_f32"], name="gate_fp32", to=TensorProto.FLOAT),
        helper.make_node("Softplus", ["gate_f32"], ["softplus"], name="softplus"),
        helper.make_node("Neg", ["softplus"], ["g"], name="to_g"),
        helper.make_node("GatedDeltaRule", ["q", "k", "v", "g", "beta", "past.0.recurrent"],
                         ["o", "present.0.recurrent"], name=NAME_GDR, domain="gdn", plugin_version=gdr_version,
                         plugin_namespace="gdn", scale=DK ** -0.5, use_qk_l2norm=1),
        helper.make_node("Cast", ["o"], ["out"], name="out_fp32", to=TensorProto.FLOAT),
    ]
    inputs = [
        helper.make_tensor_value_info("x", dtype, ["batch", "seq", C]),
        helper.make_tensor_value_info("past.0.conv", dtype, ["batch", C, K - 1]),
        helper.make_tensor_value_info("past.0.recurrent", TensorProto.FLOAT, ["batch", HV, DK, DV]),
    ]
    outputs = [
        helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", HV, DV]),
        helper.make_tensor_value_info("present.0.conv", dtype, ["batch", C, K - 1]),
        helper.make_tensor_value_info("present.0.recurrent", TensorProto.FLOAT, ["batch", HV, DK, DV]),
    ]
    graph = helper.make_graph(nodes, "gdn_plugins", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("gdn", 1)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


# ---------------------------------------------------------------- in-place K/V cache + attention

HQ, HKV, CACHE_LEN, KV_C = 4, 2, 64, 32
NAME_KV_CONV = "kv_conv_node"


def make_kv_graph(path: Path, dtype: int = TensorProto.FLOAT16, head_dim: int = 16) -> Path:
    """The deployment-shaped attention block of the issue-11 graph, hand-made (opset 24):

        x [batch, seq, 32] -> gdn.CausalConv1d (+ past.0.conv) -> y -> q [B, 4, S, D], k / v [B, 2, S, D]
        TensorScatter(past.1.key [B, 2, 64, D], k, write_indices = past_lengths, axis 2) -> present.1.key
        (same for value), bool mask [B, 1, S, 64]: cache slot j <= past_lengths[b] + i
        Attention (opset 23, GQA 4:2) -> out [B, 4, S, D] (model dtype)
    """
    rng = np.random.default_rng(1)
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    d = head_dim

    def init(name, array):
        if dtype == TensorProto.BFLOAT16:
            return helper.make_tensor(name, dtype, array.shape, array.astype(np.float32).flatten().tolist())
        return numpy_helper.from_array(array.astype(np_dtype), name)

    def ints(name, values):
        return numpy_helper.from_array(np.array(values, np.int64), name)

    inits = [
        init("kv_conv_w", rng.standard_normal((KV_C, K)) * 0.3), init("kv_conv_b", np.zeros(KV_C)),
        init("w_q", rng.standard_normal((KV_C, HQ * d)) * 0.1),
        init("w_k", rng.standard_normal((KV_C, HKV * d)) * 0.1),
        init("w_v", rng.standard_normal((KV_C, HKV * d)) * 0.1),
        ints("shape_q", [0, 0, HQ, d]), ints("shape_kv", [0, 0, HKV, d]),
        ints("slots", list(range(CACHE_LEN))), ints("zero", 0), ints("one", 1),
        ints("axes_0", [0]), ints("axes_1", [1]), ints("axes_2", [2]), ints("axes_1_2", [1, 2]),
    ]
    nodes = [
        *_seq_lens_nodes("x", "kv_seq_lens"),
        helper.make_node("CausalConv1d", ["x", "kv_conv_w", "kv_conv_b", "past.0.conv", "kv_seq_lens"],
                         ["y", "present.0.conv"], name=NAME_KV_CONV, domain="gdn", plugin_version="1",
                         plugin_namespace="gdn", activation=1),
    ]
    for name, heads, shape in (("q", HQ, "shape_q"), ("k", HKV, "shape_kv"), ("v", HKV, "shape_kv")):
        nodes += [helper.make_node("MatMul", ["y", f"w_{name}"], [f"{name}_flat"], name=f"proj_{name}"),
                  helper.make_node("Reshape", [f"{name}_flat", shape], [f"{name}_bshd"], name=f"reshape_{name}"),
                  helper.make_node("Transpose", [f"{name}_bshd"], [f"{name}_new"], name=f"to_bhsd_{name}",
                                   perm=[0, 2, 1, 3])]
    nodes += [
        helper.make_node("TensorScatter", ["past.1.key", "k_new", "past_lengths"], ["present.1.key"],
                         name="kv_update_key", axis=2),
        helper.make_node("TensorScatter", ["past.1.value", "v_new", "past_lengths"], ["present.1.value"],
                         name="kv_update_value", axis=2),
        # mask[b, 0, i, j] = j <= past_lengths[b] + i
        helper.make_node("Shape", ["x"], ["x_shape"], name="x_shape"),
        helper.make_node("Gather", ["x_shape", "one"], ["seq"], name="seq_len", axis=0),
        helper.make_node("Range", ["zero", "seq", "one"], ["steps"], name="steps"),
        helper.make_node("Unsqueeze", ["past_lengths", "axes_1"], ["past_col"], name="past_col"),
        helper.make_node("Unsqueeze", ["steps", "axes_0"], ["steps_row"], name="steps_row"),
        helper.make_node("Add", ["past_col", "steps_row"], ["q_pos"], name="q_pos"),
        helper.make_node("Unsqueeze", ["q_pos", "axes_2"], ["q_pos3"], name="q_pos3"),
        helper.make_node("LessOrEqual", ["slots", "q_pos3"], ["mask3"], name="mask"),
        helper.make_node("Unsqueeze", ["mask3", "axes_1"], ["mask"], name="mask4"),
        helper.make_node("Attention", ["q_new", "present.1.key", "present.1.value", "mask"], ["out"],
                         name="attention", q_num_heads=HQ, kv_num_heads=HKV, scale=d ** -0.5),
    ]
    inputs = [
        helper.make_tensor_value_info("x", dtype, ["batch", "seq", KV_C]),
        helper.make_tensor_value_info("past_lengths", TensorProto.INT64, ["batch"]),
        helper.make_tensor_value_info("past.0.conv", dtype, ["batch", KV_C, K - 1]),
        helper.make_tensor_value_info("past.1.key", dtype, ["batch", HKV, CACHE_LEN, d]),
        helper.make_tensor_value_info("past.1.value", dtype, ["batch", HKV, CACHE_LEN, d]),
    ]
    outputs = [
        helper.make_tensor_value_info("out", dtype, ["batch", HQ, "seq", d]),
        helper.make_tensor_value_info("present.0.conv", dtype, ["batch", KV_C, K - 1]),
        helper.make_tensor_value_info("present.1.key", dtype, ["batch", HKV, CACHE_LEN, d]),
        helper.make_tensor_value_info("present.1.value", dtype, ["batch", HKV, CACHE_LEN, d]),
    ]
    graph = helper.make_graph(nodes, "kv_attention", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24), helper.make_opsetid("gdn", 1)])
    model.metadata_props.add(key="gdn_export.cache_len", value=str(CACHE_LEN))
    onnx.save(model, str(path))
    return path
