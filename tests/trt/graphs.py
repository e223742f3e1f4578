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
        # seq_lens [batch] int32 = seq for every row, as the exporter emits it without ragged rows
        helper.make_node("Shape", ["x"], ["x_b"], name="x_batch", start=0, end=1),
        helper.make_node("Shape", ["x"], ["x_t"], name="x_seq", start=1, end=2),
        helper.make_node("Cast", ["x_t"], ["x_t32"], name="seq_int32", to=TensorProto.INT32),
        helper.make_node("Expand", ["x_t32", "x_b"], ["seq_lens"], name="seq_lens"),
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
