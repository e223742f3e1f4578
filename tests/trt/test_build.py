"""build_engine makes real engines (TensorRT-RTX builds them without a GPU) whose plugin layers
are the gdn plugins: a hand-made two-node graph in each activation dtype, and the exported tiny
checkpoints of both families."""

from __future__ import annotations

import json

import pytest
from onnx import TensorProto

from gdn_export.trt import build_engine, inspect_engine
from gdn_export.trt.build import layers_path
from tests.trt.graphs import NAME_CONV, NAME_GDR, make_plugin_graph

DTYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}


def _plugin_layers(info):
    return {layer.name: layer.plugin for layer in info.plugin_layers()}


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_handmade_graph_builds_with_both_plugins(plugins_lib, tmp_path, dtype):
    onnx_path = make_plugin_graph(tmp_path / "graph.onnx", DTYPES[dtype])
    messages = []
    engine = build_engine(onnx_path, tmp_path / "graph.engine", plugins=plugins_lib, progress=messages.append,
                          min_shapes="x:[1,1,32]", opt_shapes="x:[2,16,32]", max_shapes="x:[4,128,32]",
                          workspace=64 << 20)
    assert engine == tmp_path / "graph.engine" and engine.stat().st_size > 10_000
    assert not list(tmp_path.glob(".*tmp*")), "temporary files left behind"
    assert any("building" in m for m in messages) and messages[-1].startswith("wrote ")
    info = inspect_engine(engine, plugins=plugins_lib)
    assert _plugin_layers(info) == {NAME_CONV: ("CausalConv1d", "1", "gdn"),
                                    NAME_GDR: ("GatedDeltaRule", "1", "gdn")}
    # The plugins are serialized into the plan itself, not only named in the build record.
    assert info.plan_plugin_names["GatedDeltaRule"] >= 1 and info.plan_plugin_names["CausalConv1d"] >= 1
    record = json.loads(layers_path(engine).read_text())
    assert record["inputs"] == ["x", "past.0.conv", "past.0.recurrent"]
    assert record["outputs"] == ["out", "present.0.conv", "present.0.recurrent"]


def test_engine_is_replaced_atomically(plugins_lib, tmp_path):
    onnx_path = make_plugin_graph(tmp_path / "graph.onnx")
    target = tmp_path / "graph.engine"
    target.write_bytes(b"old engine")
    build_engine(onnx_path, target, plugins=plugins_lib)
    assert target.read_bytes() != b"old engine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph.engine", "graph.engine.layers.json", "graph.onnx"]


@pytest.mark.slow
@pytest.mark.parametrize("family, dtype", [("qwen3_5", "fp16"), ("qwen3_5", "bf16"), ("qwen3_next", "bf16"),
                                           ("qwen3_5_moe", "fp16"), ("olmo_hybrid", "bf16")],
                         ids=lambda v: v)
def test_tiny_checkpoint_engine_is_deployment_shaped(plugins_lib, tiny_root, family, dtype):
    """fp16 / bf16 exports of every family: KV_CACHE_UPDATE and fused ATTENTION layers next to the
    gdn plugin layers, every cache and state output updated in place, two profiles. The pairs cover
    every family, both dtypes and the MoE plugin in both (one each on the two MoE families); an
    engine build costs ~20 s of CPU, so not every family builds in both."""
    import torch

    from tests.onnx._tiny import tiny_export
    from tests.trt.engine_checks import check_deployment_engine

    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    model, onnx_path = tiny_export(family, tiny_root, torch_dtype)
    engine = build_engine(onnx_path, tiny_root / f"{family}-{dtype}.engine", plugins=plugins_lib)
    kinds = model.config.layer_kinds
    n_gdn = sum(kind != "full_attention" for kind in kinds)
    n_attn = len(kinds) - n_gdn
    n_moe = sum(model.config.is_moe_layer(i) for i in range(len(kinds)))
    record = check_deployment_engine(engine, plugins_lib, kv_layers=2 * n_attn, attention_layers=n_attn,
                                     plugin_layers=2 * n_gdn + n_moe)
    info = inspect_engine(engine, plugins=plugins_lib)
    assert info.plan_plugin_names["GatedDeltaRule"] >= n_gdn
    assert "gdn_export.state_specs" in record["metadata"]  # what TrtRunner reads
    assert record["inputs"][:3] == ["input_ids", "past_lengths", "seq_lens"]


@pytest.mark.slow
@pytest.mark.parametrize("state_dtype", ["bfloat16", "float16"], ids=["bf16-state", "fp16-state"])
def test_16bit_state_export_builds(plugins_lib, tiny_root, state_dtype):
    """--state-dtype bf16 / fp16: the GatedDeltaRule plugin takes the 16-bit state (its dtype is the
    plugin's free choice, final_state follows it) in an fp16 engine, updated in place."""
    import onnx
    import torch

    from gdn_export.layout import DeployLayout
    from tests.onnx._tiny import tiny_export
    from tests.trt.engine_checks import check_deployment_engine

    layout = DeployLayout.make(cache_len=160, state_dtype=state_dtype)
    model, onnx_path = tiny_export("qwen3_5", tiny_root, torch.float16, layout=layout)
    types = {v.name: v.type.tensor_type.elem_type for v in onnx.load(onnx_path).graph.input}
    want = {"bfloat16": TensorProto.BFLOAT16, "float16": TensorProto.FLOAT16}[state_dtype]
    assert types["past.0.recurrent"] == want and types["past.0.conv"] == TensorProto.FLOAT16
    engine = build_engine(onnx_path, tiny_root / f"state-{state_dtype}.engine", plugins=plugins_lib)
    kinds = model.config.layer_kinds
    n_gdn = sum(kind != "full_attention" for kind in kinds)
    n_attn = len(kinds) - n_gdn
    check_deployment_engine(engine, plugins_lib, kv_layers=2 * n_attn, attention_layers=n_attn,
                            plugin_layers=2 * n_gdn)
