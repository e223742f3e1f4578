"""The exact law of three sampled tokens after a prompt, and a chi-square test of samples against it:
how the speculative sampling tests (tests/runtime, tests/serve) check that the rejection rule keeps
the model's own distribution."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch


def exact_law(model, prompt: np.ndarray, vocab: int, dist: Callable[[torch.Tensor], torch.Tensor]) -> np.ndarray:
    """P(x1, x2, x3) [V, V, V] of sampling three tokens after `prompt` from `model` (a tiny one of
    `vocab` tokens), each drawn from dist(logits [N, V] fp32) -> probabilities [N, V]."""
    pairs = np.array([[a, b] for a in range(vocab) for b in range(vocab)])
    rows = np.concatenate([np.tile(prompt, (len(pairs), 1)), pairs], 1)
    with torch.no_grad():
        hidden, *_ = model.hidden_states(torch.from_numpy(rows), torch.zeros(len(rows), dtype=torch.long),
                                         torch.full((len(rows),), rows.shape[1]), *model.empty_states(len(rows)))
        logits = model.lm_head(hidden[:, -3:]).float().reshape(-1, vocab)
        p = dist(logits).double().reshape(len(rows), 3, vocab).numpy()
    first = p[0, 0]  # [V]
    second = p[::vocab, 1]  # [V (x1), V]
    third = p[:, 2].reshape(vocab, vocab, vocab)
    return first[:, None, None] * second[:, :, None] * third


def chi_square(samples: np.ndarray, law: np.ndarray) -> tuple[float, float]:
    """(statistic, bound at p = 1e-3) of samples [N, 3] against law [V, V, V], over the cells
    expecting >= 5, the others pooled in one."""
    vocab = law.shape[0]
    counts = np.zeros(vocab ** 3)
    np.add.at(counts, samples[:, 0] * vocab * vocab + samples[:, 1] * vocab + samples[:, 2], 1)
    expected = law.reshape(-1) * len(samples)
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    z = 3.0902  # upper 1e-3 quantile of N(0, 1); Wilson-Hilferty
    return stat, df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
