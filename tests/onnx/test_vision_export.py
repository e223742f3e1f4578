"""Two-file export of vision-language checkpoints, run in ONNX Runtime against transformers
(fp32, 1e-4): the vision graph on images of several sizes and a video, the language graph through
the vision-language runner (prefill with images, decode) on a ragged batch of rows with and without
images, in the gdn form and the ort form (the MoE family is exported in the ort form, the other's
gdn file also runs rewritten to it); the files' I/O and metadata; a vision file of another
checkpoint is refused."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
import torch

pytest.importorskip("transformers")

from gdn_export.errors import InputError  # noqa: E402
from gdn_export.layout import DeployLayout  # noqa: E402
from gdn_export.onnx.export import rewrite_form  # noqa: E402
from gdn_export.onnx.forms import KEY_ONNX_OPS, form_of  # noqa: E402
from gdn_export.vlm import export as vx  # noqa: E402
from gdn_export.vlm.export import export_vlm  # noqa: E402
from gdn_export.vlm.runner import VisualInputs, generate_vl, open_vlm  # noqa: E402
from tests.onnx._same import machine_paths_in  # noqa: E402
from tests.test_transformers_parity_vlm import hf_run, make_row  # noqa: E402
from tests.vlm_models import FAMILIES, TEXT_VOCAB, hf_checkpoint, pixels  # noqa: E402

pytestmark = pytest.mark.slow
ATOL, STEPS = 1e-4, 3
_EXPORTS: dict = {}
FORM = {"qwen3_5": "gdn", "qwen3_5_moe": "ort"}  # export_vlm(onnx_ops=...) of each family


@pytest.fixture(scope="module", params=FAMILIES)
def exported(request, tmp_path_factory):
    family = request.param
    if family not in _EXPORTS:
        hf, directory = hf_checkpoint(family, tmp_path_factory)
        out = tmp_path_factory.mktemp(f"vlm-onnx-{family}") / "model.onnx"
        layout = DeployLayout.make(cache_len=160)
        _EXPORTS[family] = (hf, directory, *export_vlm(directory, out, layout=layout, onnx_ops=FORM[family]))
    return _EXPORTS[family]


def test_files_io_and_metadata(exported):
    _, _, lpath, vpath = exported
    assert vpath.name == "model.vision.onnx" and vpath.parent == lpath.parent
    lang, vis = onnx.load(str(lpath)), onnx.load(str(vpath))
    form = FORM[{p.key: p.value for p in lang.metadata_props}["gdn_export.family"]]
    assert form_of(lang) == form and form_of(vis) == "gdn"
    assert {p.key: p.value for p in lang.metadata_props}.get(KEY_ONNX_OPS) == (None if form == "gdn" else form)
    assert [i.name for i in lang.graph.input[:6]] == ["input_ids", "past_lengths", "seq_lens",
                                                       "rope_positions", "visual_embeds", "visual_index"]
    assert [i.name for i in vis.graph.input] == ["pixel_values", "grid_thw"]
    assert [o.name for o in vis.graph.output] == ["visual_embeds"]
    dims = [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in vis.graph.input]
    assert dims == [["num_patches", 96], ["num_grids", 3]]
    lm = {p.key: p.value for p in lang.metadata_props}
    vm = {p.key: p.value for p in vis.metadata_props}
    assert lm[vx.KEY_FINGERPRINT] == vm[vx.KEY_FINGERPRINT] and len(lm[vx.KEY_FINGERPRINT]) == 64
    assert lm[vx.KEY_ROLE] == "language" and vm[vx.KEY_ROLE] == "vision"
    assert lm[vx.KEY_MROPE] == "[4, 2, 2]" and lm[vx.KEY_HIDDEN] == "64"
    assert not list(lpath.parent.glob(".*"))  # no temporary folder left
    assert machine_paths_in(lpath) == machine_paths_in(vpath) == []


@pytest.mark.parametrize("grid, video", [([[1, 4, 6], [1, 10, 14], [1, 2, 2]], False), ([[2, 4, 4]], True),
                                         ([[1, 2, 2]], False)], ids=["3-images", "video", "smallest"])
def test_vision_graph_matches_transformers(exported, grid, video):
    hf, _, lpath, _ = exported
    _, vision = open_vlm(lpath)
    pv = pixels(grid, seed=5)
    fn = hf.model.get_video_features if video else hf.model.get_image_features
    with torch.no_grad():
        want = torch.cat(fn(pv, torch.tensor(grid)).pooler_output).numpy()
    got = vision.encode(pv.numpy(), np.array(grid))
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= ATOL


def test_language_graph_matches_transformers_ragged(exported, tmp_path):
    """Rows with 2 images, none, and a video in one batch: prefill and decode logits of every row
    equal transformers on that row alone, for the exported file and (a gdn-form file) its ort form."""
    hf, _, lpath, vpath = exported
    runner, vision = open_vlm(lpath)
    from gdn_export.vlm.runner import tokens_of

    tokens = tokens_of(vision)
    cases = [([[1, 4, 6], [1, 2, 8]], [], 2, 3), None, ([], [[2, 2, 2]], 1, 2)]
    rows, wants, img_pv, img_grid, vid_pv, vid_grid = [], [], [], [], [], []
    for i, case in enumerate(cases):
        if case is None:
            row = np.random.default_rng(i).integers(0, TEXT_VOCAB, 11)
            wants.append(hf_run(hf, row, [], [], None, None, tokens, STEPS))
        else:
            row, pv_i, pv_v = make_row(case, tokens, seed=40 + i)
            wants.append(hf_run(hf, row, case[0], case[1], pv_i, pv_v, tokens, STEPS))
            if case[0]:
                img_pv.append(pv_i.numpy())
                img_grid += case[0]
            if case[1]:
                vid_pv.append(pv_v.numpy())
                vid_grid += case[1]
        rows.append(row)
    visual = VisualInputs(np.concatenate(img_pv), np.array(img_grid), np.concatenate(vid_pv), np.array(vid_grid))
    runners = [runner]
    if form_of(onnx.load(str(lpath), load_external_data=False)) == "gdn":
        ort_path = tmp_path / "model.onnx"
        shutil.copyfile(lpath, ort_path)
        rewrite_form(ort_path, "ort")
        runners.append(open_vlm(ort_path, vision_file=vpath)[0])
    for r in runners:
        result = generate_vl(r, vision, rows, visual, STEPS + 1)
        for b, want in enumerate(wants):
            diffs = [np.abs(result.step_logits[0][b, -1] - want[0][-1].numpy()).max()]
            diffs += [np.abs(result.step_logits[s + 1][b, -1] - want[s + 1].numpy()).max() for s in range(STEPS)]
            assert max(diffs) <= ATOL, f"{r.kernels_note}, row {b}: {diffs}"
            # transformers' greedy choices are ours
            assert result.generated[b, 0] == int(want[0][-1].argmax())
    assert runners[-1].kernels_note.startswith("ort form")


def test_vision_file_of_another_checkpoint_is_refused(exported, tmp_path):
    """A vision file whose fingerprint differs (the same file with another checkpoint's
    fingerprint written in) is refused by name before anything runs."""
    _, _, lpath, vpath = exported
    proto = onnx.load(str(vpath))
    for p in proto.metadata_props:
        if p.key == vx.KEY_FINGERPRINT:
            p.value = "0" * 64
    foreign = tmp_path / "other.vision.onnx"
    onnx.save(proto, str(foreign))
    with pytest.raises(InputError, match="other.vision.onnx comes from another checkpoint than model.onnx"):
        open_vlm(lpath, vision_file=foreign)
