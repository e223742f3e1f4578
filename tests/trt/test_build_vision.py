"""`build` of a vision-language export (TensorRT-RTX here, CPU-only build): an fp16 export of a tiny
checkpoint made by transformers builds into model.engine + model.vision.engine, with the vision
profile and the language engine's visual rows spanning the image sizes asked for."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from gdn_export.errors import GdnExportError  # noqa: E402
from gdn_export.layout import DeployLayout  # noqa: E402
from tests.vlm_models import hf_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow


def test_vlm_export_builds_both_engines(plugins_lib, tmp_path_factory):
    from gdn_export.trt.build import layers_path
    from gdn_export.vlm.build import build_vlm, patch_grid, read_vision_file
    from gdn_export.vlm.export import export_vlm

    _, ckpt = hf_checkpoint("qwen3_5", tmp_path_factory)
    root = tmp_path_factory.mktemp("vlm-trt")
    lpath, vpath = export_vlm(ckpt, root / "model.onnx", dtype=torch.float16,
                              layout=DeployLayout.make(cache_len=256))
    engine, vengine = build_vlm(lpath, root / "model.engine", image_sizes="40x56,96x64", max_images=2,
                                plugins=plugins_lib, max_batch=2, max_prefill=128)
    assert engine.is_file() and vengine.name == "model.vision.engine" and vengine.is_file()
    config, processor, _ = read_vision_file(vpath)
    small = patch_grid(40, 56, config, processor)
    large = patch_grid(96, 64, config, processor)
    assert small == (18, 12) and large == (16, 24)  # as the processor resizes them (tests/cli)
    vrecord = json.loads(layers_path(vengine).read_text())
    (profile,) = vrecord["profiles"]
    assert profile["shapes"]["pixel_values"] == [[216, 96], [384, 96], [768, 96]]
    assert profile["shapes"]["grid_thw"] == [[1, 3], [1, 3], [2, 3]]
    lrecord = json.loads(layers_path(engine).read_text())
    for prof in lrecord["profiles"]:  # prefill and decode
        assert prof["shapes"]["visual_embeds"] == [[0, 64], [96, 64], [192, 64]]
        assert prof["shapes"]["visual_index"] == [[0], [96], [192]]


def test_bad_image_sizes_are_refused(tmp_path):
    from gdn_export.vlm.build import parse_image_sizes

    assert parse_image_sizes("448x448, 1024X768") == [(448, 448), (1024, 768)]
    for bad in ("448", "448x", "0x448", "axb"):
        with pytest.raises(GdnExportError, match="is not WIDTHxHEIGHT"):
            parse_image_sizes(bad)
