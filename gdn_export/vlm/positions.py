"""Prompts with visual placeholders and their 3-D rotary positions, computed on the host.

    rope_index(ids [T], image_grids, video_grids, tokens) -> (positions [3, T] int64, rope_delta)

follows transformers' Qwen3.5 `get_rope_index` for one row: the row splits into runs of text,
image-placeholder and video-placeholder tokens; text counts on from the current position p (all
three streams equal); a visual run of grid (t, h, w) (a video contributes one (1, h, w) grid per
frame, in order) gets positions (p + frame, p + row, p + column) over its t x h/m x w/m merged
tokens, and p advances by max(h, w) / m. rope_delta = max position + 1 - T: decode step t of a
row at past length P has position P + t + rope_delta on all three streams.

`VisualCall` gathers what one prefill call of a batch needs: rope_positions [3, B, T], the flat
placeholder index of every visual feature row (images first, then videos, each in row-major
token order, as transformers' masked_scatter fills them) and each row's rope_delta. A count of
placeholders that differs from the features is an InputError naming both numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from gdn_export.errors import InputError


@dataclass(frozen=True)
class VisualTokens:
    """Placeholder and delimiter token ids and the merge size m of a vision-language model."""

    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    spatial_merge_size: int

    @classmethod
    def from_config(cls, config) -> "VisualTokens":
        """From a gdn_export.vision_config.VisionConfig (or anything with the same fields)."""
        return cls(config.image_token_id, config.video_token_id, config.vision_start_token_id,
                   config.vision_end_token_id, config.spatial_merge_size)

    def merged(self, grid) -> int:
        t, h, w = (int(v) for v in grid)
        return t * h * w // self.spatial_merge_size ** 2


def frames(video_grids) -> list[tuple[int, int, int]]:
    """A video grid (t, h, w) as its t frame grids (1, h, w), as get_rope_index splits them."""
    return [(1, int(h), int(w)) for t, h, w in video_grids for _ in range(int(t))]


def build_prompt(text_ids: Sequence[int], image_grids, video_grids, tokens: VisualTokens) -> np.ndarray:
    """[T] int64: for each image `vision_start, image_token x (h w / m^2), vision_end`, then for each
    video frame the same with video_token (the delimiters separate frames, as get_rope_index
    needs), then `text_ids`."""
    out: list[int] = []
    for grid, token in [(g, tokens.image_token_id) for g in image_grids] + \
                       [(g, tokens.video_token_id) for g in frames(video_grids)]:
        out += [tokens.vision_start_token_id] + [token] * tokens.merged(grid) + [tokens.vision_end_token_id]
    return np.array(out + [int(i) for i in text_ids], dtype=np.int64)


def _runs(kinds: np.ndarray) -> Iterator[tuple[int, int, int]]:
    """(kind, start, end) of each run of equal values."""
    if len(kinds) == 0:
        return
    edges = np.flatnonzero(np.diff(kinds)) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges, [len(kinds)]])
    for s, e in zip(starts, ends):
        yield int(kinds[s]), int(s), int(e)


def token_kinds(ids: np.ndarray, tokens: VisualTokens) -> np.ndarray:
    """[T] int64: 0 text, 1 image placeholder, 2 video placeholder (transformers' mm_token_type_ids)."""
    return (ids == tokens.image_token_id).astype(np.int64) + 2 * (ids == tokens.video_token_id)


def rope_index(ids: np.ndarray, image_grids: Iterator, frame_grids: Iterator,
               tokens: VisualTokens) -> tuple[np.ndarray, int]:
    """(positions [3, T] int64, rope_delta) of one row (module docstring). image_grids and
    frame_grids are iterators shared across rows (grids are consumed in order)."""
    m = tokens.spatial_merge_size
    ids = np.asarray(ids, dtype=np.int64)
    out = np.zeros((3, len(ids)), np.int64)
    p = 0
    for kind, start, end in _runs(token_kinds(ids, tokens)):
        if kind == 0:
            out[:, start:end] = p + np.arange(end - start)
            p += end - start
            continue
        what = "image" if kind == 1 else "video frame"
        grid = next(image_grids if kind == 1 else frame_grids, None)
        if grid is None:
            raise InputError(f"the prompt has more {what} placeholder spans than {what}s given")
        t, h, w = int(grid[0]), int(grid[1]) // m, int(grid[2]) // m
        if end - start != t * h * w:
            shown = tuple(int(v) for v in grid)
            raise InputError(f"a run of {end - start} {what} placeholder tokens, but its grid {shown} gives "
                             f"{t * h * w} features")
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
        out[:, start:end] = np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + p
        p += max(h, w)
    delta = int(out.max()) + 1 - len(ids) if len(ids) else 0
    return out, delta


@dataclass
class VisualCall:
    """One prefill call's visual inputs (module docstring): rope_positions [3, B, T] int64,
    visual_index [N] int64 (images' placeholders first, then videos'), rope_delta [B] int64."""

    rope_positions: np.ndarray
    visual_index: np.ndarray
    rope_delta: np.ndarray


def visual_call(rows: Sequence[np.ndarray], width: int, image_grids, video_grids,
                tokens: VisualTokens) -> VisualCall:
    """VisualCall for prompts `rows` (1-D int64, real tokens only) right-padded to `width`, with
    image_grids [Ni, 3] and video_grids [Nv, 3] (either may be empty) in the order their
    placeholders appear (row by row). InputError when the placeholders and the grids disagree."""
    image_grids = [tuple(int(v) for v in g) for g in (image_grids if image_grids is not None else [])]
    video_grids = [tuple(int(v) for v in g) for g in (video_grids if video_grids is not None else [])]
    for kind, grids, token in (("image", image_grids, tokens.image_token_id),
                               ("video", video_grids, tokens.video_token_id)):
        have = sum(int((np.asarray(r) == token).sum()) for r in rows)
        want = sum(tokens.merged(g) for g in grids)
        if have != want:
            raise InputError(f"the prompts hold {have} {kind} placeholder tokens but the {kind}s give "
                             f"{want} features ({len(grids)} {kind}{'s' if len(grids) != 1 else ''})")
    images, frame_iter = iter(image_grids), iter(frames(video_grids))
    B = len(rows)
    positions = np.zeros((3, B, width), np.int64)
    deltas = np.zeros(B, np.int64)
    image_index, video_index = [], []
    for b, row in enumerate(rows):
        row = np.asarray(row, dtype=np.int64)
        pos, deltas[b] = rope_index(row, images, frame_iter, tokens)
        n = len(row)
        positions[:, b, :n] = pos
        # Padded tokens: positions continue after the row (inert: no real query reads them).
        positions[:, b, n:] = n + deltas[b] + np.arange(width - n)
        image_index.append(b * width + np.flatnonzero(row == tokens.image_token_id))
        video_index.append(b * width + np.flatnonzero(row == tokens.video_token_id))
    index = np.concatenate(image_index + video_index).astype(np.int64)
    return VisualCall(positions, index, deltas)


def decode_positions(past_lengths: np.ndarray, seq: int, rope_delta: np.ndarray) -> np.ndarray:
    """[3, B, seq] int64 rotary positions of a text call after the prompt: past + t + rope_delta."""
    pos = past_lengths[:, None] + np.arange(seq)[None, :] + rope_delta[:, None]
    return np.broadcast_to(pos[None], (3, *pos.shape)).astype(np.int64).copy()
