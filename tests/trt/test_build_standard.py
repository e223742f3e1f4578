"""`build` takes the standard form (opset-27 LinearAttention / CausalConvWithState): the blocks are
rewritten to gdn nodes in a temporary file for TensorRT's parser, and the engine's plugin layers are
those of the gdn form."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto

from gdn_export.onnx.standard_ops import to_standard
from gdn_export.trt import build_engine, inspect_engine
from tests.onnx._same import file_digest
from tests.trt.graphs import make_plugin_graph


def _plugins(info):
    return sorted(layer.plugin for layer in info.plugin_layers())


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT16, TensorProto.BFLOAT16], ids=["fp16", "bf16"])
def test_standard_form_builds_to_the_gdn_plugins(plugins_lib, tmp_path, dtype):
    gdn_path = make_plugin_graph(tmp_path / "gdn.onnx", dtype)
    std_path = tmp_path / "standard.onnx"
    onnx.save(to_standard(onnx.load(gdn_path)), std_path)
    before = file_digest(std_path)
    messages = []
    engine = build_engine(std_path, tmp_path / "standard.engine", plugins=plugins_lib,
                          progress=messages.append, min_shapes="x:[1,1,32]", opt_shapes="x:[2,16,32]",
                          max_shapes="x:[4,128,32]", workspace=64 << 20)
    assert any("rewritten to gdn nodes" in m for m in messages)
    assert file_digest(std_path) == before, f"{std_path} changed"
    assert not list(tmp_path.glob(".*")), "temporary files left behind"
    assert _plugins(inspect_engine(engine, plugins=plugins_lib)) == [
        ("CausalConv1d", "1", "gdn"), ("GatedDeltaRule", "1", "gdn")]


@pytest.mark.slow
def test_standard_export_of_a_tiny_checkpoint_builds(plugins_lib, tiny_root, tmp_path):
    import torch

    from tests.onnx._tiny import tiny_standard

    _, std = tiny_standard("qwen3_5", tiny_root, dtype=torch.float16)
    engine = build_engine(std, tmp_path / "standard.engine", plugins=plugins_lib, max_batch=2,
                          max_prefill=16, workspace=256 << 20)
    names = {layer.plugin[0] for layer in inspect_engine(engine, plugins=plugins_lib).plugin_layers()}
    assert names == {"CausalConv1d", "GatedDeltaRule"}
