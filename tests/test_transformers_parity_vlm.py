"""Vision-language parity with transformers' Qwen3_5ForConditionalGeneration /
Qwen3_5MoeForConditionalGeneration (fp32 logits within 1e-4): prefill with one image, images of
different sizes, a short video, images and video together, then greedy decode steps; and a ragged
batch of rows with and without images against each row run alone in transformers. Tiny
checkpoints made by transformers with unusual sizes (tests/vlm_models.py); our vision tower and our
language model load from the saved folder."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from gdn_export.layout import DeployLayout  # noqa: E402
from gdn_export.models.vlm import HybridVLForCausalLM  # noqa: E402
from gdn_export.vlm.positions import (VisualTokens, build_prompt, decode_positions,  # noqa: E402
                                      token_kinds, visual_call)
from gdn_export.vlm.weights import load_vision  # noqa: E402
from gdn_export.weights import load_checkpoint  # noqa: E402
from tests.vlm_models import DEFAULT_MROPE, FAMILIES, TEXT_VOCAB, hf_checkpoint, pixels  # noqa: E402

pytestmark = pytest.mark.slow
ATOL, STEPS = 1e-4, 4
CASES = {  # (image grids, video grids, text tokens before, text tokens after)
    "one-image": ([[1, 4, 6]], [], 3, 5),
    "images-of-3-sizes": ([[1, 4, 6], [1, 10, 14], [1, 2, 2]], [], 0, 7),
    "video": ([], [[2, 4, 4]], 2, 4),
    "image-and-video": ([[1, 6, 2]], [[3, 2, 4]], 1, 63),
}


@pytest.fixture(scope="module", params=FAMILIES)
def models(request, tmp_path_factory):
    return _models(request.param, tmp_path_factory)


def _models(family, tmp_path_factory):
    hf, directory = hf_checkpoint(family, tmp_path_factory)
    lm = load_checkpoint(directory, model_class=HybridVLForCausalLM)
    vision = load_vision(directory)
    return hf, lm, vision, VisualTokens.from_config(vision.config)


def make_row(case, tokens, seed):
    images, videos, before, after = case
    gen = np.random.default_rng(seed)
    text = lambda n: gen.integers(0, TEXT_VOCAB, n)  # noqa: E731
    row = np.concatenate([text(before), build_prompt(text(after), images, videos, tokens)])
    pv_img = pixels(images, seed) if images else None
    pv_vid = pixels(videos, seed + 100) if videos else None
    return row, pv_img, pv_vid


@torch.no_grad()
def hf_run(hf, row, images, videos, pv_img, pv_vid, tokens, steps):
    """transformers' logits: prefill [T, V] and steps x [V] (greedy)."""
    ids = torch.from_numpy(row)[None]
    hf.model.rope_deltas = None  # transformers keeps the last prompt's deltas on the model
    kwargs = dict(mm_token_type_ids=torch.from_numpy(token_kinds(row, tokens))[None])
    if images:
        kwargs.update(pixel_values=pv_img, image_grid_thw=torch.tensor(images))
    if videos:
        kwargs.update(pixel_values_videos=pv_vid, video_grid_thw=torch.tensor(videos))
    out = hf(input_ids=ids, use_cache=True, **kwargs)
    logits, cache = [out.logits[0]], out.cache
    for _ in range(steps):
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        out = hf(input_ids=token, cache=cache, use_cache=True)
        cache = out.cache
        logits.append(out.logits[0, -1])
    return logits


@torch.no_grad()
def ours_run(lm, vision, rows, grids, pvs, tokens, steps, picks):
    """Our logits for a ragged batch: prefill [B, T, V] then per step [B, V], feeding the tokens
    `picks` [steps][B] (transformers' greedy choices)."""
    images = [g for gs in grids for g in gs[0]]
    videos = [g for gs in grids for g in gs[1]]
    feats = []
    img_pv = [p[0] for p in pvs if p[0] is not None]
    vid_pv = [p[1] for p in pvs if p[1] is not None]
    if images:
        feats.append(vision(torch.cat(img_pv), torch.tensor(images)))
    if videos:
        feats.append(vision(torch.cat(vid_pv), torch.tensor(videos)))
    embeds = torch.cat(feats) if feats else torch.zeros(0, lm.config.hidden_size)
    B, width = len(rows), max(len(r) for r in rows)
    call = visual_call(rows, width, images, videos, tokens)
    ids = torch.zeros(B, width, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, :len(r)] = torch.from_numpy(r)
    lens = torch.tensor([len(r) for r in rows])
    lm.layout = DeployLayout.make(cache_len=width + steps + 2, logits="all")
    logits, *states = lm(ids, torch.zeros(B, dtype=torch.long), lens, torch.from_numpy(call.rope_positions),
                         embeds, torch.from_numpy(call.visual_index), *lm.empty_states(B))
    out = [logits]
    past = lens.clone()
    for step in range(steps):
        token = torch.tensor(picks[step])[:, None]
        pos = decode_positions(past.numpy(), 1, call.rope_delta)
        logits, *states = lm(token, past, torch.ones(B, dtype=torch.long), torch.from_numpy(pos),
                             torch.zeros(0, lm.config.hidden_size), torch.zeros(0, dtype=torch.long), *states)
        out.append(logits[:, 0])
        past += 1
    return out


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_prefill_and_decode_match_transformers(models, case):
    hf, lm, vision, tokens = models
    images, videos = case[0], case[1]
    row, pv_img, pv_vid = make_row(case, tokens, seed=11)
    want = hf_run(hf, row, images, videos, pv_img, pv_vid, tokens, STEPS)
    picks = [[int(w.argmax())] for w in [want[0][-1]] + want[1:-1]]
    got = ours_run(lm, vision, [row], [(images, videos)], [(pv_img, pv_vid)], tokens, STEPS, picks)
    diffs = [(got[0][0] - want[0]).abs().max().item()]
    diffs += [(g[0] - w).abs().max().item() for g, w in zip(got[1:], want[1:])]
    assert max(diffs) <= ATOL, f"max |logits diff| per step (prefill first): {diffs}"
    assert want[0].std() > 0.3


def test_ragged_batch_rows_with_and_without_images(models):
    """Rows of different lengths, with 0, 1 and 3 images and a video, in one batch: each row's
    prefill (at its real tokens) and decode logits equal transformers on that row alone."""
    hf, lm, vision, tokens = models
    cases = [([[1, 4, 6]], [], 2, 3), ([], [], 9, 0), ([[1, 2, 4], [1, 8, 4], [1, 2, 2]], [], 1, 1),
             ([], [[2, 2, 2]], 0, 2)]
    rows, grids, pvs, wants = [], [], [], []
    for i, case in enumerate(cases):
        if not case[0] and not case[1]:
            row = np.random.default_rng(i).integers(0, TEXT_VOCAB, case[2])
            pv = (None, None)
        else:
            row, *pv = make_row(case, tokens, seed=20 + i)
        rows.append(row)
        grids.append((case[0], case[1]))
        pvs.append(tuple(pv))
        wants.append(hf_run(hf, row, case[0], case[1], *pv, tokens, STEPS))
    picks = [[int((w[0][-1] if s == 0 else w[s]).argmax()) for w in wants] for s in range(STEPS)]
    got = ours_run(lm, vision, rows, grids, pvs, tokens, STEPS, picks)
    for b, want in enumerate(wants):
        n = len(rows[b])
        diffs = [(got[0][b, :n] - want[0]).abs().max().item()]
        diffs += [(g[b] - w).abs().max().item() for g, w in zip(got[1:], want[1:])]
        assert max(diffs) <= ATOL, f"row {b}: max |logits diff| per step: {diffs}"


def test_config_without_mrope_section_uses_transformers_default(tmp_path_factory):
    """No mrope_section in config.json: transformers' [11, 11, 10] (not plain rope)."""
    hf, lm, vision, tokens = _models(DEFAULT_MROPE, tmp_path_factory)
    assert lm.config.mrope_section is None
    case = ([[1, 4, 6]], [], 3, 5)
    row, pv_img, _ = make_row(case, tokens, seed=5)
    want = hf_run(hf, row, case[0], [], pv_img, None, tokens, 2)
    picks = [[int(w.argmax())] for w in [want[0][-1]] + want[1:-1]]
    got = ours_run(lm, vision, [row], [(case[0], [])], [(pv_img, None)], tokens, 2, picks)
    diffs = [(got[0][0] - want[0]).abs().max().item()] + [(g[0] - w).abs().max().item()
                                                           for g, w in zip(got[1:], want[1:])]
    assert max(diffs) <= ATOL, diffs
