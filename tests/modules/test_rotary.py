"""Partial rope with the rotate_half pairing, against an explicit pairwise rotation."""

from __future__ import annotations

import math

import pytest
import torch

from gdn_export.modules.rotary import RotaryEmbedding, apply_rotary


def _explicit(x, positions, rotary_dim, theta):
    """Channel i pairs with i + R/2 and turns by pos * theta^(-2i/R)."""
    out = x.clone()
    half = rotary_dim // 2
    for b in range(x.shape[0]):
        for t in range(x.shape[2]):
            for i in range(half):
                angle = positions[b, t].item() * theta ** (-2 * i / rotary_dim)
                c, s = math.cos(angle), math.sin(angle)
                x1, x2 = x[b, :, t, i], x[b, :, t, i + half]
                out[b, :, t, i] = x1 * c - x2 * s
                out[b, :, t, i + half] = x2 * c + x1 * s
    return out


@pytest.mark.parametrize("head_dim, rotary_dim", [(16, 4), (16, 16), (24, 8)], ids=["D16-R4", "D16-R16", "D24-R8"])
def test_matches_explicit_rotation_and_keeps_tail(head_dim, rotary_dim):
    torch.manual_seed(0)
    rope = RotaryEmbedding(rotary_dim, theta=10000.0)
    x = torch.randn(2, 3, 5, head_dim, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 100, 1001, 3, 0]])
    cos, sin = rope(positions, torch.float64)
    assert cos.shape == (2, 5, rotary_dim)
    y = apply_rotary(x, cos, sin)
    # angles are formed in fp32 (as transformers does): ~1e-4 at position 1001
    torch.testing.assert_close(y, _explicit(x, positions, rotary_dim, 10000.0), atol=3e-4, rtol=0)
    assert torch.equal(y[..., rotary_dim:], x[..., rotary_dim:])


def test_scores_depend_on_relative_position_only():
    torch.manual_seed(1)
    rope = RotaryEmbedding(16, theta=500.0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m, n):
        cq, sq = rope(torch.tensor([[m]]), torch.float32)
        ck, sk = rope(torch.tensor([[n]]), torch.float32)
        return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum()

    torch.testing.assert_close(score(10, 3), score(107, 100), atol=1e-4, rtol=1e-4)


def test_frequencies_survive_model_dtype_cast():
    rope = RotaryEmbedding(8, theta=1e6)
    rope.to(torch.bfloat16)
    assert rope.inv_freq().dtype == torch.float32
    cos, _ = rope(torch.tensor([[30000]]), torch.float32)
    ref = torch.cos(30000 * torch.tensor(1e6) ** (-torch.arange(0, 8, 2) / 8.0))
    torch.testing.assert_close(cos[0, 0, :4], ref.float(), atol=1e-2, rtol=0)
