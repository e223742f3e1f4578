"""build_engine makes a real engine (TensorRT-RTX builds without a GPU) from a graph whose only
custom node is gdn.MoE, in each activation dtype: the MoE plugin is found, configured and
serialized into the plan."""

from __future__ import annotations

import pytest
from onnx import TensorProto

from gdn_export.trt import build_engine
from tests.trt.moe_graph import H, make_moe_graph

DTYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_moe_graph_builds_with_the_plugin(plugins_lib, tmp_path, dtype):
    onnx_path = make_moe_graph(tmp_path / "moe.onnx", DTYPES[dtype])
    engine = build_engine(onnx_path, tmp_path / "moe.engine", plugins=plugins_lib,
                          min_shapes=f"x:[1,{H}]", opt_shapes=f"x:[8,{H}]", max_shapes=f"x:[512,{H}]",
                          workspace=64 << 20)
    assert engine.stat().st_size > 10_000
    plan = engine.read_bytes()
    # the plugin (name and its serialized fields) is in the plan itself
    assert b"MoE" in plan and b"top_k" in plan and b"norm_topk_prob" in plan
