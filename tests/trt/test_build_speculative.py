"""`gdn-export build` of the graphs `export --speculative K` writes (TensorRT-RTX builds them without
a GPU): the verify form, whose GDN layers are one GatedDeltaRuleSteps plugin layer each (nothing
aliased: TensorRT-RTX fails to build a copy of an aliased state input that another layer also reads),
and the MTP head, of a dense and a MoE family in both 16-bit dtypes."""

from __future__ import annotations

import json

import pytest
import torch

from gdn_export.cli.main import main
from gdn_export.layout import DeployLayout
from gdn_export.onnx.speculative import export_mtp, export_verify
from gdn_export.trt import inspect_engine
from gdn_export.trt.build import layers_path
from gdn_export.weights import load_checkpoint
from gdn_export.weights.mtp import load_mtp
from tests.mtp_checkpoints import mtp_checkpoint

K = 3


@pytest.mark.slow
@pytest.mark.parametrize("family, dtype", [("qwen3_5", torch.bfloat16), ("qwen3_5_moe", torch.float16)],
                         ids=["qwen3_5-bf16", "qwen3_5_moe-fp16"])
def test_verify_and_head_engines_build(plugins_lib, tmp_path_factory, tmp_path, capsys, family, dtype):
    ckpt = mtp_checkpoint(family, tmp_path_factory.getbasetemp())
    model = load_checkpoint(ckpt, dtype=dtype)
    model.layout = DeployLayout.make(cache_len=64)
    verify = export_verify(model, tmp_path / "m.verify.onnx", K)
    head = export_mtp(load_mtp(ckpt, model), tmp_path / "m.mtp.onnx")
    n_gdn = model.config.layer_kinds.count("linear_attention")
    n_moe = sum(model.config.is_moe_layer(i) for i in range(len(model.config.layer_kinds)))
    for onnx_path, plugins in ((verify, {"GatedDeltaRuleSteps": n_gdn, "MoE": n_moe}), (head, {"MoE": int(n_moe > 0)})):
        engine = tmp_path / (onnx_path.stem + ".engine")
        code = main(["build", str(onnx_path), "-o", str(engine), "--plugins", str(plugins_lib), "-q"])
        assert code == 0, capsys.readouterr().err
        info = inspect_engine(engine, plugins=plugins_lib)
        got = {}
        for layer in info.plugin_layers():
            got[layer.plugin[0]] = got.get(layer.plugin[0], 0) + 1
        assert got == {name: n for name, n in plugins.items() if n}, (onnx_path.name, got)
        record = json.loads(layers_path(engine).read_text())
        assert record["metadata"]["gdn_export.speculative"] == ("verify" if onnx_path == verify else "mtp")
    # the verify engine's one profile holds the K + 1 tokens a row
    record = json.loads(layers_path(tmp_path / "m.verify.engine").read_text())
    (profile,) = record["profiles"]
    assert [dims[1] for dims in profile["shapes"]["input_ids"]] == [K + 1] * 3
