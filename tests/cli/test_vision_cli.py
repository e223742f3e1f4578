"""The command line with a vision-language checkpoint made by transformers (tests/vlm_models.py):
`export` writes model.onnx + model.vision.onnx (or the text graph alone with --text-only);
`run --image` / `--pixel-values` gives the same tokens and logits on torch and ort, and the tokens
of transformers' own greedy generation; `validate` passes; bad input (not an image, a grid that
does not match the pixels, placeholders that do not match the features, a vision file of another
checkpoint, a concat export) ends in one line, exit 2, nothing written."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

pytest.importorskip("transformers")
PIL = pytest.importorskip("PIL.Image")

from gdn_export.cli.main import main  # noqa: E402
from gdn_export.vlm import export as vx  # noqa: E402
from tests.vlm_models import IMAGE, hf_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow
NEW = 4


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    hf, ckpt = hf_checkpoint("qwen3_5", tmp_path_factory)
    root = tmp_path_factory.mktemp("vlm-cli")
    rng = np.random.default_rng(0)
    PIL.fromarray((rng.random((40, 56, 3)) * 255).astype("uint8")).save(root / "a.png")
    PIL.fromarray((rng.random((30, 20, 3)) * 255).astype("uint8")).convert("L").save(root / "b.jpg")
    (root / "notes.png").write_text("not an image")
    assert main(["export", str(ckpt), "-o", str(root / "model.onnx"), "--max-cache-len", "256", "-q"]) == 0
    return hf, ckpt, root


def test_export_writes_both_files(files):
    _, _, root = files
    assert sorted(p.name for p in root.iterdir()) == ["a.png", "b.jpg", "model.onnx", "model.vision.onnx",
                                                      "notes.png"]


def test_text_only_export_is_todays_graph(files, tmp_path):
    _, ckpt, _ = files
    assert main(["export", str(ckpt), "-o", str(tmp_path / "text.onnx"), "--text-only", "-q"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["text.onnx"]
    names = [i.name for i in onnx.load(str(tmp_path / "text.onnx")).graph.input[:4]]
    assert names == ["input_ids", "past_lengths", "seq_lens", "past.0.conv"]


def _run(model, root, out, *extra):
    argv = ["run", str(model), "--max-new-tokens", str(NEW), "--save-logits", str(out), "-q",
            "--input-ids", "3,4,5", "--input-ids", "9,8", *extra]
    assert main(argv) == 0
    return dict(np.load(out))


def test_run_with_images_torch_ort_and_transformers_agree(files, tmp_path, capsys):
    hf, ckpt, root = files
    images = ["--image", str(root / "a.png"), "--image", str(root / "b.jpg")]
    got = {name: _run(model, root, tmp_path / f"{name}.npz", *images)
           for name, model in (("torch", ckpt), ("ort", root / "model.onnx"))}
    np.testing.assert_array_equal(got["torch"]["generated"], got["ort"]["generated"])
    for key in got["torch"]:
        if key.startswith("step_"):
            np.testing.assert_allclose(got["ort"][key], got["torch"][key], atol=1e-4, rtol=0, err_msg=key)
    # transformers' processor and greedy generation on the first row give the same tokens
    from transformers import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil(patch_size=4, temporal_patch_size=2, merge_size=2)
    out = proc(images=[PIL.open(root / "a.png"), PIL.open(root / "b.jpg")], return_tensors="pt")
    lines = capsys.readouterr().out.strip().splitlines()
    row = np.array([int(t) for t in lines[0].split()])
    prompt = torch.from_numpy(row[:len(row) - NEW])[None]
    hf.model.rope_deltas = None
    kinds = (prompt == IMAGE).long()
    gen = hf.generate(input_ids=prompt, pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"],
                      mm_token_type_ids=kinds, max_new_tokens=NEW, do_sample=False)
    np.testing.assert_array_equal(gen[0, prompt.shape[1]:].numpy(), got["torch"]["generated"][0])


def test_run_with_pixel_values_file(files, tmp_path):
    _, _, root = files
    grid = np.array([[1, 4, 6]])
    npz = tmp_path / "pixels.npz"
    np.savez(npz, pixel_values=np.random.default_rng(1).standard_normal((24, 96)).astype(np.float32),
             image_grid_thw=grid)
    saved = _run(root / "model.onnx", root, tmp_path / "out.npz", "--pixel-values", str(npz))
    assert saved["prompt_lengths"].tolist() == [3 + 6 + 2, 2]


def test_text_prompts_on_the_vision_language_graph(files, tmp_path):
    """No images: the vision-language model.onnx runs text prompts as the checkpoint does."""
    _, ckpt, root = files
    ort = _run(root / "model.onnx", root, tmp_path / "ort.npz")
    torch_ = _run(ckpt, root, tmp_path / "torch.npz", "--image", str(root / "a.png"))  # another prompt
    text = _run(ckpt, root, tmp_path / "text.npz")  # the checkpoint as a text model
    np.testing.assert_array_equal(ort["generated"], text["generated"])
    np.testing.assert_allclose(ort["step_0"], text["step_0"], atol=1e-4, rtol=0)
    assert not np.array_equal(torch_["generated"][0], text["generated"][0]) or \
        not np.allclose(torch_["step_0"][0], text["step_0"][0], atol=1e-3)  # the image matters


def test_validate_with_images(files, capsys):
    """The text validate's table: every row with its tolerances, then the verdict line."""
    _, ckpt, root = files
    assert main(["validate", str(ckpt), "--onnx", str(root / "model.onnx"), "--image", str(root / "a.png"),
                 "-q"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[1].split() == ["backend", "phase", "tensor", "max", "abs", "max", "rel", "atol", "rtol"]
    rows = [line.split() for line in lines[3:-1]]
    assert [r[1:3] for r in rows][:2] == [["vision", "visual_embeds"], ["prefill", "logits"]]
    assert [" ".join(r[1:4]) for r in rows[2:]] == [f"decode {i} logits" for i in range(1, 5)]
    assert all(r[-3:] == ["0.0001", "0.001", "ok"] for r in rows)
    assert lines[-1] == "PASS: 6 tensors within tolerance"
    assert main(["validate", str(ckpt), "--onnx", str(root / "model.onnx"), "--atol", "0", "--rtol", "0",
                 "-q"]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("FAIL: ")


def test_run_on_the_checkpoint_without_images_says_what_it_runs(files, tmp_path, capsys):
    _, ckpt, _ = files
    assert main(["run", str(ckpt), "--input-ids", "3,4", "--max-new-tokens", "1"]) == 0
    err = capsys.readouterr().err
    assert "vision-language checkpoint without --image / --pixel-values: running its language model alone" in err
    assert "export" not in err


def _refused(argv, match, capsys, tmp_path):
    before = set(tmp_path.iterdir())
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err
    assert set(tmp_path.iterdir()) == before  # nothing written


@pytest.fixture
def foreign_vision(files, tmp_path):
    """model.onnx beside a vision file whose fingerprint is another checkpoint's."""
    _, _, root = files
    import shutil

    shutil.copy(root / "model.onnx", tmp_path / "model.onnx")
    proto = onnx.load(str(root / "model.vision.onnx"))
    for p in proto.metadata_props:
        if p.key == vx.KEY_FINGERPRINT:
            p.value = "f" * 64
    onnx.save(proto, str(tmp_path / "model.vision.onnx"))
    return tmp_path / "model.onnx"


def test_bad_inputs_are_one_line_errors(files, tmp_path, capsys, foreign_vision, tmp_path_factory):
    _, ckpt, root = files
    out = str(tmp_path / "never.npz")
    base = ["run", str(root / "model.onnx"), "--input-ids", "1,2", "--save-logits", out, "-q"]
    _refused(base + ["--image", str(root / "notes.png")], "notes.png: not an image Pillow can read",
             capsys, tmp_path)
    npz = tmp_path.parent / f"{tmp_path.name}-grid.npz"
    np.savez(npz, pixel_values=np.zeros((20, 96), np.float32), image_grid_thw=np.array([[1, 4, 6]]))
    _refused(base + ["--pixel-values", str(npz)], "20 patch rows but grid_thw [[1, 4, 6]] describes 24",
             capsys, tmp_path)
    extra = ["run", str(root / "model.onnx"), "--input-ids", f"{IMAGE},1,2", "--image", str(root / "a.png"),
             "--save-logits", out, "-q"]
    _refused(extra, "hold 55 image placeholder tokens but the images give 54 features", capsys, tmp_path)
    _refused(["run", str(foreign_vision), "--input-ids", "1,2", "--image", str(root / "a.png"), "-q"],
             "model.vision.onnx comes from another checkpoint than model.onnx", capsys, tmp_path)
    _, moe_ckpt = hf_checkpoint("qwen3_5_moe", tmp_path_factory)
    _refused(["validate", str(moe_ckpt), "--onnx", str(root / "model.onnx"), "-q"],
             "was exported from another checkpoint", capsys, tmp_path)
    _refused(["export", str(ckpt), "-o", str(tmp_path / "c.onnx"), "--kv-cache", "concat", "-q"],
             "need the inplace kv cache", capsys, tmp_path)
    _refused(["run", str(ckpt), "--input-ids", "1", "--image", str(root / "a.png"), "--prefill-chunk", "4"],
             "--prefill-chunk does not apply", capsys, tmp_path)
    _refused(["run", str(root / "model.engine"), "--input-ids", "1", "--image", str(root / "a.png")],
             "model.engine: no such file or folder", capsys, tmp_path)
