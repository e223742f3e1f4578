"""Host-side rotary positions and prompts: `rope_index` / `visual_call` against transformers'
`get_rope_index` (right-padded batches, images and videos, text between and around), and the
placeholder-count errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from gdn_export.errors import InputError  # noqa: E402
from gdn_export.vlm.positions import (VisualTokens, build_prompt, decode_positions,  # noqa: E402
                                      token_kinds, visual_call)
from tests.vlm_models import END, IMAGE, START, TEXT_VOCAB, VIDEO  # noqa: E402

TOKENS = VisualTokens(IMAGE, VIDEO, START, END, 2)
ROWS = {  # per row: (text before, image grids, video grids, text after)
    "image-then-text": [(3, [[1, 4, 6]], [], 5)],
    "rows-with-and-without": [(0, [[1, 2, 8], [1, 6, 2]], [], 2), (7, [], [], 0), (1, [[1, 2, 2]], [[2, 4, 4]], 9)],
    "video-3-frames": [(2, [], [[3, 2, 6]], 1)],
    "wide-and-tall": [(1, [[1, 2, 16]], [], 1), (4, [[1, 14, 2]], [], 3)],
}


def _rows(spec, seed=0):
    rng = np.random.default_rng(seed)
    rows, images, videos = [], [], []
    for before, imgs, vids, after in spec:
        rows.append(np.concatenate([rng.integers(0, TEXT_VOCAB, before),
                                    build_prompt(rng.integers(0, TEXT_VOCAB, after), imgs, vids, TOKENS)]))
        images += imgs
        videos += vids
    return rows, images, videos


class _Config:  # what get_rope_index reads
    class vision_config:
        spatial_merge_size = 2


@pytest.mark.parametrize("spec", list(ROWS.values()), ids=list(ROWS))
def test_matches_transformers_get_rope_index(spec):
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model

    rows, images, videos = _rows(spec)
    width = max(len(r) for r in rows) + 2  # padding after every row
    call = visual_call(rows, width, images, videos, TOKENS)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, :len(r)] = torch.from_numpy(r)
        mask[b, :len(r)] = 1
    host = type("Host", (), {"config": _Config, "get_vision_position_ids": Qwen3_5Model.get_vision_position_ids})()
    want, deltas = Qwen3_5Model.get_rope_index(
        host, ids, torch.from_numpy(token_kinds(ids.numpy(), TOKENS)),
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None, attention_mask=mask)
    for b, r in enumerate(rows):
        np.testing.assert_array_equal(call.rope_positions[:, b, :len(r)], want[:, b, :len(r)].numpy())
    np.testing.assert_array_equal(call.rope_delta, deltas[:, 0].numpy())
    # visual_index: images' placeholders first, then videos', row-major
    flat = ids.reshape(-1).numpy()
    n_img = int((flat == IMAGE).sum())
    assert (flat[call.visual_index[:n_img]] == IMAGE).all() and (flat[call.visual_index[n_img:]] == VIDEO).all()
    assert (np.diff(call.visual_index[:n_img]) > 0).all() and (np.diff(call.visual_index[n_img:]) > 0).all()


def test_decode_positions_continue_after_the_visual_span():
    rows, images, _ = _rows(ROWS["image-then-text"])
    call = visual_call(rows, len(rows[0]), images, [], TOKENS)
    pos = decode_positions(np.array([len(rows[0])]), 2, call.rope_delta)
    last = call.rope_positions[:, 0, -1].max()
    assert pos.shape == (3, 1, 2) and (pos[:, 0, 0] == last + 1).all() and (pos[:, 0, 1] == last + 2).all()


@pytest.mark.parametrize("grids, match", [
    ([[1, 4, 6], [1, 2, 2]], "hold 6 image placeholder tokens but the images give 7 features"),
    ([[1, 2, 2]], "hold 6 image placeholder tokens but the images give 1 features"),
    ([[1, 2, 6], [1, 2, 6]], "a run of 6 image placeholder tokens, but its grid"),
], ids=["more-features", "fewer-features", "split-differently"])
def test_placeholders_that_do_not_match_the_features(grids, match):
    row = build_prompt([1, 2], [[1, 4, 6]], [], TOKENS)
    if "run" in match:  # same total (6), but the first grid asks for 3 tokens in a run of 6
        grids = [[1, 2, 6], [1, 2, 6]]
    with pytest.raises(InputError, match=match):
        visual_call([row], len(row), grids, [], TOKENS)
