"""Parity of a vision-language export with its checkpoint: the vision features, the prefill logits
of prompts with images, and forced decode steps, as one gdn_export.validate Report (rows with their
tolerances, then the PASS / FAIL verdict of gdn_export.validate.format_table).

    report = run_vl_parity(reference, ref_vision, candidate, cand_vision, visual, rows, ...)

The reference drives the tokens, as in gdn_export.validate.run_parity: each decode step feeds the
reference's greedy token to both runners. Without images, `random_visual_inputs` stands in two
grids of random pixels.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from gdn_export.validate.compare import Report, Tolerances, add_row
from gdn_export.vlm.images import VisualInputs
from gdn_export.vlm.runner import encode_all, prefill_vl


def random_visual_inputs(vision_config, rng: np.random.Generator) -> VisualInputs:
    """Two images of random pixels: grids [1, 2m, 3m] and [1, m, m] (m = spatial_merge_size), pixel
    values [P, patch_dim] float32 standard normal."""
    m = vision_config.spatial_merge_size
    grids = np.array([[1, 2 * m, 3 * m], [1, m, m]], np.int64)
    pixels = rng.standard_normal((int(grids.prod(-1).sum()), vision_config.patch_dim)).astype(np.float32)
    return VisualInputs(pixels, grids)


def random_text_rows(vision_config, vocab_size: int, prompt_len: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Two rows of random ids, prompt_len and max(1, prompt_len // 2) long, with no image / video
    placeholder id among them (a stray one would not match the grids)."""
    special = [vision_config.image_token_id, vision_config.video_token_id]
    rows = [rng.integers(0, vocab_size, prompt_len), rng.integers(0, vocab_size, max(1, prompt_len // 2))]
    return [np.where(np.isin(r, special), 0, r).astype(np.int64) for r in rows]


def _forced(runner, vision, rows, visual, steps: int, picks):
    """Prefill with images, then `steps` decode calls feeding `picks` [B, steps] (None: this
    runner's greedy picks). Returns ([prefill [B, V], step [B, V] ...], picks)."""
    logits, states, lens = prefill_vl(runner, vision, rows, visual)
    out, own, past = [logits], [], lens.copy()
    for s in range(steps):
        token = picks[:, s:s + 1] if picks is not None else out[-1].argmax(-1)[:, None].astype(np.int64)
        own.append(token)
        logits, states = runner.forward(token, past, states)
        out.append(logits[:, -1])
        past += 1
    return out, (np.concatenate(own, 1) if own else np.zeros((len(rows), 0), np.int64))


def run_vl_parity(reference, ref_vision, candidate, cand_vision, visual: VisualInputs, rows, *,
                  decode_steps: int, tolerances: Tolerances, seed: int = 0,
                  progress: Callable[[str], None] | None = None) -> Report:
    """Compare `candidate` (language runner + vision encoder) with `reference` on prompts `rows`
    (1-D int64 arrays holding their placeholders) and the images / videos of `visual`.

    Rows of the report: "vision" visual_embeds [N, hidden]; "prefill" logits [B, V] at each row's
    last token; "decode i" logits [B, V] (i = 1 .. decode_steps)."""
    say = progress or (lambda _msg: None)
    lengths = [len(r) for r in rows]
    report = Report(reference.backend, len(rows), max(lengths), decode_steps, seed, prompt_lengths=lengths)
    say("vision encoders")
    add_row(report, candidate.backend, "vision", "visual_embeds", encode_all(cand_vision, visual),
         encode_all(ref_vision, visual), tolerances)
    say(f"prefill {max(lengths)} tokens x {len(rows)} rows, {decode_steps} decode steps")
    ref_logits, picks = _forced(reference, ref_vision, rows, visual, decode_steps, None)
    cand_logits, _ = _forced(candidate, cand_vision, rows, visual, decode_steps, picks)
    for i, (got, want) in enumerate(zip(cand_logits, ref_logits)):
        add_row(report, candidate.backend, "prefill" if i == 0 else f"decode {i}", "logits", got, want, tolerances)
    return report
