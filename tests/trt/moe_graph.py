"""A hand-made ONNX graph around one gdn.MoE node (onnx.helper only, no exporter), so that engine
building with the MoE plugin is tested independently of gdn_export.onnx.

    x [tokens, H] -> MatMul (router) -> logits [tokens, E]
    (x, logits, gate_up [E, 2I, H], down [E, H, I]) -> gdn.MoE -> Cast -> out fp32
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

H, E, I, TOP_K = 64, 8, 48, 2
NAME_MOE = "moe_node"


def make_moe_graph(path: Path, dtype: int = TensorProto.FLOAT16) -> Path:
    """Write the graph to `path` with activations and weights in `dtype` (TensorProto enum)."""
    rng = np.random.default_rng(0)
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)

    def init(name, array):
        if dtype == TensorProto.BFLOAT16:
            return helper.make_tensor(name, dtype, array.shape, array.astype(np.float32).flatten().tolist())
        return numpy_helper.from_array(array.astype(np_dtype), name)

    inits = [
        init("router_w", rng.standard_normal((H, E)) * 0.1),
        init("gate_up", rng.standard_normal((E, 2 * I, H)) * H**-0.5),
        init("down", rng.standard_normal((E, H, I)) * I**-0.5),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "router_w"], ["logits"], name="router"),
        helper.make_node("MoE", ["x", "logits", "gate_up", "down"], ["routed"], name=NAME_MOE, domain="gdn",
                         plugin_version="1", plugin_namespace="gdn", top_k=TOP_K, norm_topk_prob=1),
        helper.make_node("Cast", ["routed"], ["out"], name="out_fp32", to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(nodes, "gdn_moe", [helper.make_tensor_value_info("x", dtype, ["tokens", H])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["tokens", H])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("gdn", 1)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path
