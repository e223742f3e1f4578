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


_BUILT: dict = {}


def _built(plugins_lib, tmp_path_factory):
    """(checkpoint, model.onnx, model.vision.onnx, model.engine, model.vision.engine), built once."""
    if not _BUILT:
        from gdn_export.vlm.build import build_vlm
        from gdn_export.vlm.export import export_vlm

        _, ckpt = hf_checkpoint("qwen3_5", tmp_path_factory)
        root = tmp_path_factory.mktemp("vlm-trt")
        lpath, vpath = export_vlm(ckpt, root / "model.onnx", dtype=torch.float16,
                                  layout=DeployLayout.make(cache_len=256))
        engines = build_vlm(lpath, root / "model.engine", image_sizes="40x56,96x64", max_images=2,
                            plugins=plugins_lib, max_batch=2, max_prefill=128)
        _BUILT["files"] = (ckpt, lpath, vpath, *engines)
    return _BUILT["files"]


def test_vlm_export_builds_both_engines(plugins_lib, tmp_path_factory):
    from gdn_export.trt.build import layers_path
    from gdn_export.vlm.build import patch_grid, read_vision_file

    _, lpath, vpath, engine, vengine = _built(plugins_lib, tmp_path_factory)
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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none found)")
def test_vlm_engines_run_with_images(plugins_lib, tmp_path_factory):
    """The fp16 engines against the fp32 PyTorch model: vision features, prefill with an image and
    decode steps (relative RMS <= 1e-2), on a ragged batch with a text row."""
    import numpy as np

    from gdn_export.vlm.positions import build_prompt
    from gdn_export.vlm.runner import VisualInputs, open_vlm, prefill_vl, tokens_of
    from gdn_export.vlm.trt_runner import open_trt_vlm
    from tests.conftest import rel_rms
    from tests.vlm_models import pixels

    ckpt, _, _, engine, _ = _built(plugins_lib, tmp_path_factory)
    runner, vision = open_trt_vlm(engine, plugins=plugins_lib)
    ref, ref_vision = open_vlm(ckpt, layout=DeployLayout.make(cache_len=256))
    grid = np.array([[1, 12, 18]])  # a 40x56 image as the processor resizes it
    visual = VisualInputs(pixels(grid.tolist(), seed=3).numpy(), grid)
    got_v = vision.encode(visual.pixel_values, grid)
    want_v = ref_vision.encode(visual.pixel_values, grid)
    assert rel_rms(torch.from_numpy(got_v), torch.from_numpy(want_v)) <= 1e-2
    rows = [build_prompt([1, 2, 3], grid, [], tokens_of(vision)), np.array([5, 6, 7, 8])]
    outs = []
    for r in (runner, ref):
        logits, states, lens = prefill_vl(r, vision if r is runner else ref_vision, rows, visual)
        seq = [logits]
        past = lens.copy()
        for step in range(3):
            logits, states = r.forward(np.array([[11 + step], [20 + step]]), past, states)
            seq.append(logits[:, -1])
            past += 1
        outs.append(seq)
    for got, want in zip(*outs):
        assert rel_rms(torch.from_numpy(got), torch.from_numpy(want)) <= 1e-2
