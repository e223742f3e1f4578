"""The vision tower against transformers' get_image_features / get_video_features (fp32, 1e-4), on
tiny checkpoints made by transformers (tests/vlm_models.py), both families; plus the grid checks."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from gdn_export.errors import InputError  # noqa: E402
from gdn_export.vlm.weights import load_vision  # noqa: E402
from tests.vlm_models import FAMILIES, PATCH_DIM, hf_checkpoint, pixels  # noqa: E402

ATOL = 1e-4
GRIDS = {
    "one-image": [[1, 4, 6]],
    "images-of-3-sizes": [[1, 4, 6], [1, 10, 14], [1, 2, 2]],
    "tall-and-wide": [[1, 12, 2], [1, 2, 16]],
    "4-equal-images": [[1, 4, 4]] * 4,
}
VIDEO_GRIDS = {"video-2x4x4": [[2, 4, 4]], "video-and-video": [[3, 2, 6], [1, 4, 2]]}


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    hf, directory = hf_checkpoint(request.param, tmp_path_factory)
    return hf, load_vision(directory)


def _hf_features(hf, pixel_values, grid, video):
    fn = hf.model.get_video_features if video else hf.model.get_image_features
    return torch.cat(fn(pixel_values, torch.tensor(grid)).pooler_output)


@pytest.mark.parametrize("per_frame", [True, False], ids=["per-frame", "masked"])
@pytest.mark.parametrize("grid", list(GRIDS.values()), ids=list(GRIDS))
@torch.no_grad()
def test_images_match_transformers(pair, grid, per_frame):
    """Both attention paths: per frame (eager default) and the exported graph's [P, P] mask."""
    hf, ours = pair
    pv = pixels(grid, seed=len(grid))
    want = _hf_features(hf, pv, grid, video=False)
    ours.per_frame = per_frame
    try:
        got = ours(pv, torch.tensor(grid))
    finally:
        ours.per_frame = True
    assert got.shape == want.shape == (sum(t * h * w for t, h, w in grid) // 4, 64)
    assert (got - want).abs().max().item() <= ATOL
    assert want.std() > 0.1


@pytest.mark.parametrize("per_frame", [True, False], ids=["per-frame", "masked"])
@pytest.mark.parametrize("grid", list(VIDEO_GRIDS.values()), ids=list(VIDEO_GRIDS))
@torch.no_grad()
def test_videos_match_transformers(pair, grid, per_frame):
    hf, ours = pair
    pv = pixels(grid, seed=7)
    want = _hf_features(hf, pv, grid, video=True)
    ours.per_frame = per_frame
    try:
        got = ours(pv, torch.tensor(grid))
    finally:
        ours.per_frame = True
    assert (got - want).abs().max().item() <= ATOL


@torch.no_grad()
def test_each_frame_attends_within_itself(pair):
    """Features of an image do not depend on the other images of the call."""
    _, ours = pair
    grid = [[1, 4, 6], [2, 2, 4]]
    pv = pixels(grid, seed=3)
    together = ours(pv, torch.tensor(grid))
    alone = ours(pv[:24], torch.tensor(grid[:1]))
    assert torch.equal(together[:6], alone) or (together[:6] - alone).abs().max() <= 1e-5


@pytest.mark.parametrize("pixel_shape, grid, match", [
    ((24, PATCH_DIM), [[1, 4, 4]], "24 patch rows but grid_thw"),
    ((24, PATCH_DIM + 1), [[1, 4, 6]], "values, expected 96"),
    ((12, PATCH_DIM), [[1, 3, 4]], "multiples of the spatial merge size 2"),
    ((24, PATCH_DIM), [[1, 4, 6, 1]], r"must be \[num_images, 3\]"),
    ((0, PATCH_DIM), [[0, 4, 6]], "entries must be >= 1"),
], ids=["rows", "width", "merge", "grid-shape", "zero"])
def test_bad_grids_are_one_line_errors(pair, pixel_shape, grid, match):
    _, ours = pair
    with pytest.raises(InputError, match=match):
        ours(torch.zeros(pixel_shape), torch.tensor(grid))
