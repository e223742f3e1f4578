"""TensorRT-RTX and the FP8 K/V cache graph (docs/quantization.md, "FP8 K/V cache").

The fact, read from TensorRT-RTX's own parser on the exported form (QuantizeLinear ->
TensorScatter on a FLOAT8E4M3FN cache -> DequantizeLinear -> Attention): its KV cache update layer
refuses an FP8 cache. `build` therefore refuses such a file by name, with the TensorRT version,
before any work (before the plugin library is even looked up), and writes nothing. If a TensorRT
release accepts the cache, test_parser_refuses_fp8_cache fails: gdn_export.trt.kv_fp8.REFUSED is
then to be narrowed to the releases that refuse it.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gdn_export.errors import GdnExportError
from gdn_export.onnx.metadata import KEY_KV_CACHE_FORMAT
from gdn_export.trt import build_engine
from gdn_export.trt.kv_fp8 import REFUSED

F8 = TensorProto.FLOAT8E4M3FN


def fp8_cache_graph(path, metadata: bool = True):
    """past.1.key [batch, 2, 64, 16] FLOAT8E4M3FN <- TensorScatter(QuantizeLinear(k)) -> present.1.key
    -> DequantizeLinear -> Cast(fp16) -> Attention (GQA 4:2), as export writes an FP8 cache."""
    dt, L, D = TensorProto.FLOAT16, 64, 16
    nodes = [
        helper.make_node("Cast", ["k"], ["k32"], to=TensorProto.FLOAT),
        helper.make_node("QuantizeLinear", ["k32", "ks"], ["kq"], output_dtype=F8, saturate=1),
        helper.make_node("TensorScatter", ["past.1.key", "kq", "past_lengths"], ["present.1.key"], axis=2,
                         mode="linear"),
        helper.make_node("DequantizeLinear", ["present.1.key", "ks"], ["kd32"]),
        helper.make_node("Cast", ["kd32"], ["kd"], to=dt),
        helper.make_node("Attention", ["q", "kd", "kd", "mask"], ["out"], scale=0.25, q_num_heads=4, kv_num_heads=2),
    ]
    graph = helper.make_graph(
        nodes, "fp8_kv",
        [helper.make_tensor_value_info("past.1.key", F8, ["batch", 2, L, D]),
         helper.make_tensor_value_info("k", dt, ["batch", 2, "seq", D]),
         helper.make_tensor_value_info("past_lengths", TensorProto.INT64, ["batch"]),
         helper.make_tensor_value_info("q", dt, ["batch", 4, "seq", D]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", 1, "seq", L])],
        [helper.make_tensor_value_info("out", dt, ["batch", 4, "seq", D]),
         helper.make_tensor_value_info("present.1.key", F8, ["batch", 2, L, D])],
        [numpy_helper.from_array(np.array(0.05, np.float32), "ks")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    model.ir_version = 10
    if metadata:
        helper.set_model_props(model, {KEY_KV_CACHE_FORMAT: "fp8", "gdn_export.kv_cache": "inplace",
                                       "gdn_export.cache_len": str(L)})
    onnx.save(model, path)
    return path


def test_parser_refuses_fp8_cache(trt_flavour, tmp_path):
    from gdn_export.trt.loader import import_trt

    trt = import_trt()
    model = onnx.load(fp8_cache_graph(tmp_path / "kv8.onnx"))
    logger = trt.Logger(trt.Logger.ERROR)
    network = trt.Builder(logger).create_network(0)
    parser = trt.OnnxParser(network, logger)
    ok = parser.parse(model.SerializeToString())
    errors = " ".join(parser.get_error(i).desc() for i in range(parser.num_errors))
    assert trt_flavour in REFUSED, f"{trt_flavour} is not listed as refusing FP8 caches: parse ok={ok}"
    assert not ok and "cache has type FP8" in errors, errors


def test_build_refuses_by_name_before_work(trt_flavour, tmp_path):
    onnx_path = fp8_cache_graph(tmp_path / "kv8.onnx")
    engine = tmp_path / "kv8.engine"
    # no plugin library at that path: the FP8 refusal comes first
    with pytest.raises(GdnExportError, match=rf"FP8 K/V cache .* which {trt_flavour} \d+\.\d+[.\d]* cannot build") as exc:
        build_engine(onnx_path, engine, plugins=tmp_path / "missing.so")
    assert "\n" not in str(exc.value)
    assert list(tmp_path.iterdir()) == [onnx_path]


def _as_export(path):
    """The graph with the I/O names and version key of an export, which `build` asks of its input
    before anything else (gdn_export.trt.build.check_exported): input_ids, past_lengths, seq_lens
    first, logits the first output."""
    model = onnx.load(str(path))
    g = model.graph
    inputs = {v.name: v for v in g.input}
    order = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
             inputs["past_lengths"], helper.make_tensor_value_info("seq_lens", TensorProto.INT64, ["batch"]),
             *(v for v in g.input if v.name != "past_lengths")]
    del g.input[:]
    g.input.extend(order)
    for node in g.node:
        node.output[:] = ["logits" if o == "out" else o for o in node.output]
    g.output[0].name = "logits"
    model.metadata_props.add(key="gdn_export.version", value="0.1.0")
    onnx.save(model, str(path))
    return path


def test_cli_build_exit_2(trt_flavour, tmp_path, capsys):
    """An export with an FP8 K/V cache: refused by name before the plugin library is looked up."""
    from gdn_export.cli.main import main

    onnx_path = _as_export(fp8_cache_graph(tmp_path / "kv8.onnx"))
    code = main(["build", str(onnx_path), "-o", str(tmp_path / "e.engine"), "--plugins", str(tmp_path / "x.so")])
    err = capsys.readouterr().err
    assert code == 2 and "FP8 K/V cache" in err and trt_flavour in err
    assert not (tmp_path / "e.engine").exists()


def test_graph_without_the_key_is_not_refused_here(trt_flavour, tmp_path):
    """Only the metadata decides (a model-dtype cache graph goes on to the plugin lookup)."""
    onnx_path = fp8_cache_graph(tmp_path / "plain.onnx", metadata=False)
    with pytest.raises(GdnExportError, match="plugin library not found"):
        build_engine(onnx_path, tmp_path / "e.engine", plugins=tmp_path / "missing.so")
