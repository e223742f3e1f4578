"""Token picking: greedy is the argmax; sampling draws from the softmax of logits / temperature cut to
top_k and top_p (frequencies against the exact distribution); a seed fixes a row's draws whatever
the other rows are."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_export.serve.sampling import SamplingParams, pick_tokens, sample

V = 12
LOGITS = torch.linspace(-2.0, 2.0, V)[torch.randperm(V, generator=torch.Generator().manual_seed(0))]


def _expected(temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """The distribution a row should be drawn from, computed in float64 by sorting."""
    x = LOGITS.double().numpy() / temperature
    order = np.argsort(-x)
    p = np.exp(x[order] - x[order].max())
    p /= p.sum()
    keep = np.ones(V, bool)
    if top_k:
        keep[top_k:] = False
    before = np.cumsum(p) - p
    keep &= (before < top_p) | (np.arange(V) == 0)
    q = np.zeros(V)
    q[order[keep]] = p[keep] / p[keep].sum()
    return q


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.5, 0, 1.0), (1.3, 4, 1.0),
                                                     (1.0, 0, 0.6), (0.8, 5, 0.7)],
                         ids=["plain", "cold", "top_k", "top_p", "both"])
def test_draws_follow_the_distribution(temperature, top_k, top_p):
    n = 20000
    params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)] * n
    drawn = sample(LOGITS.expand(n, V).contiguous(), params, [None] * n, torch.Generator().manual_seed(1))
    freq = np.bincount(drawn.numpy(), minlength=V) / n
    want = _expected(temperature, top_k, top_p)
    assert (freq[want == 0] == 0).all(), "a token outside top_k / top_p was drawn"
    # 5 standard deviations of a binomial frequency
    assert np.all(np.abs(freq - want) <= 5 * np.sqrt(want * (1 - want) / n) + 1e-9), (freq, want)


def test_greedy_rows_take_the_argmax_and_seeds_fix_draws():
    logits = torch.randn(4, 40, generator=torch.Generator().manual_seed(2))
    greedy, seeded, free = SamplingParams(), SamplingParams(temperature=1.5, seed=42), SamplingParams(temperature=1.5)
    assert greedy.greedy and SamplingParams(temperature=1.0, top_k=1).greedy and not seeded.greedy

    def seeded_draw(row: int, params: list[SamplingParams], shared_seed: int) -> int:
        """Row `row` of a batch (logits[0] there, seed 42) beside other rows."""
        x = logits.clone()
        x[row] = logits[0]
        gens = [torch.Generator().manual_seed(p.seed) if p.seed is not None else None for p in params]
        out = pick_tokens(x[:len(params)], params, gens, torch.Generator().manual_seed(shared_seed))
        for i, p in enumerate(params):
            if p.greedy:
                assert int(out[i]) == int(x[i].argmax())
        return int(out[row])

    alone = seeded_draw(0, [seeded], 0)
    assert seeded_draw(2, [greedy, free, seeded], 1) == alone
    assert seeded_draw(1, [free, seeded, greedy, free], 2) == alone
    # other seeds draw other tokens (64 seeds of a 40-token distribution: not all the same)
    many = pick_tokens(logits[:1].expand(64, 40).contiguous(), [seeded] * 64,
                       [torch.Generator().manual_seed(s) for s in range(64)], torch.Generator())
    assert len(set(many.tolist())) > 1
