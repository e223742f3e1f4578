"""TensorRT-RTX builds quantized exports (fp16 graphs of tiny qwen3_5 checkpoints): FP8 (ModelOpt
form, calibrated), W4A16 INT4-AWQ and the published 128 x 128 FP8 form. The build record shows the
quantized GEMMs: FP8 GEMM layers (`gemm` engine layers of the fp8_linear nodes, fed the FP8-quantized
activation), INT4 DequantizeLinear layers fused by Myelin into its fully-connected kernels."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from gdn_export.trt import build_engine
from gdn_export.trt.build import layers_path
from tests.onnx._tiny import TWO_LAYERS


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from gdn_export.weights.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("qtrt") / "bf", "qwen3_5", seed=4,
                                hidden_size=192, intermediate_size=320, **TWO_LAYERS)


def _export(src, fmt, folder):
    from gdn_export.onnx.export import export_onnx
    from gdn_export.quantize.pipeline import quantize_model
    from gdn_export.weights import load_checkpoint
    from tests.weights.fp8_checkpoints import to_published_fp8

    if fmt == "fp8-block128":
        to_published_fp8(src, folder / "pub")
        model = load_checkpoint(folder / "pub", dtype=torch.float16)
    else:
        rows = [np.random.default_rng(0).integers(0, 256, 48) for _ in range(3)]
        model, _ = quantize_model(load_checkpoint(src, dtype=torch.float16), src, fmt, rows=rows)
    return model, export_onnx(model, folder / f"{fmt}.onnx")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["fp8", "int4-awq", "fp8-block128"])
def test_quantized_engine_builds(plugins_lib, tiny, tmp_path, fmt):
    from gdn_export.modules.quant_linear import QuantLinear

    model, onnx_path = _export(tiny, fmt, tmp_path)
    n_quant = sum(isinstance(m, QuantLinear) for m in model.modules())
    engine = build_engine(onnx_path, tmp_path / f"{fmt}.engine", plugins=plugins_lib)
    record = json.loads(layers_path(engine).read_text())
    assert record["metadata"]["gdn_export.quantization"] == fmt
    kinds = Counter(layer["type"] for layer in record["layers"])
    n_gdn = sum(kind != "full_attention" for kind in model.config.layer_kinds)
    if fmt == "fp8":
        # Sibling FP8 GEMMs share one QuantizeLinear (one input scale per group).
        assert kinds["DEQUANTIZE"] == n_quant + kinds["QUANTIZE"] and kinds["QUANTIZE"] >= 2 * n_gdn
        gemms = [e for e in record["engine_layers"] if e["type"] == "gemm" and "fp8_linear" in e["name"]]
        assert len(gemms) >= 3 * n_gdn, record["engine_layers"]
        assert any("q8" in i for e in gemms for i in e["inputs"])  # an FP8-quantized activation feeds them
    else:
        assert kinds["DEQUANTIZE"] == n_quant and kinds["QUANTIZE"] == 0
        if fmt == "int4-awq":
            fused = [e for e in record["engine_layers"] if e["type"] == "runtime_fusion" and "Fc" in e["name"]]
            assert len(fused) >= 3 * n_gdn, record["engine_layers"]
        else:
            gemms = [e for e in record["engine_layers"] if e["type"] == "gemm" and "fp8_block_linear" in e["name"]]
            assert len(gemms) >= 3 * n_gdn, record["engine_layers"]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["fp8", "int4-awq"])
def test_quantized_experts_engine_builds(plugins_lib, tmp_path, fmt):
    """A Qwen3.5-MoE export with quantized routed experts: the stacked FP8 / INT4 expert weights go
    through standalone DequantizeLinear layers into the MoE plugin (which takes 16-bit weights)."""
    from gdn_export.weights.tiny import make_tiny_checkpoint

    src = make_tiny_checkpoint(tmp_path / "bf", "qwen3_5_moe", seed=4, hidden_size=160, moe_intermediate_size=40,
                               **TWO_LAYERS)
    model, onnx_path = _export(src, fmt, tmp_path)
    n_moe = sum(1 for m in model.modules() if type(m).__name__ in ("Fp8MoeExperts", "Int4MoeExperts"))
    assert n_moe > 0
    engine = build_engine(onnx_path, tmp_path / f"{fmt}.engine", plugins=plugins_lib)
    record = json.loads(layers_path(engine).read_text())
    kinds = Counter(layer["type"] for layer in record["layers"])
    assert kinds["DEQUANTIZE"] >= 2 * n_moe, kinds  # gate_up and down of every MoE layer
    assert kinds["PLUGIN_V3"] >= n_moe or any("MoE" in str(layer) for layer in record["layers"]), kinds
