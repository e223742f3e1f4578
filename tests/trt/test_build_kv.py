"""CPU-only TensorRT-RTX builds of the deployment-shaped attention block (ONNX TensorScatter +
Attention + a gdn plugin, hand-made): KV_CACHE_UPDATE and ATTENTION layers next to the plugin,
cache outputs in place, two profiles; fp16 / bf16, head dim 16 (no fused kernel: decomposed) and 128."""

from __future__ import annotations

import json

import pytest
from onnx import TensorProto

from gdn_export.trt import build_engine
from gdn_export.trt.build import layers_path
from tests.trt.engine_checks import check_deployment_engine
from tests.trt.graphs import CACHE_LEN, make_kv_graph

DTYPES = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}


@pytest.mark.parametrize("head_dim", [16, 128], ids=["d16", "d128"])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_kv_cache_attention_plugin_graph_builds(plugins_lib, tmp_path, dtype, head_dim):
    onnx_path = make_kv_graph(tmp_path / "kv.onnx", DTYPES[dtype], head_dim)
    messages = []
    engine = build_engine(onnx_path, tmp_path / "kv.engine", plugins=plugins_lib, max_batch=4, max_prefill=32,
                          progress=messages.append)
    assert any("1 attention layers may decompose" in m for m in messages), messages
    record = check_deployment_engine(engine, plugins_lib, kv_layers=2, attention_layers=1, plugin_layers=1)
    prefill, decode = (p["shapes"] for p in record["profiles"])
    assert prefill["x"] == [[1, 1, 32], [1, 32, 32], [4, 32, 32]]  # opt seq = min(128, max_prefill)
    assert decode["x"] == [[1, 1, 32], [4, 1, 32], [4, 1, 32]]
    assert decode["past.1.key"][2] == [4, 2, CACHE_LEN, head_dim]
    assert record["decomposable_attention"] == 1
    assert json.loads(layers_path(engine).read_text())["metadata"]["gdn_export.cache_len"] == str(CACHE_LEN)
