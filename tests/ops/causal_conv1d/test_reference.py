"""The conv reference against a literal per-element loop, and state chaining."""

import pytest
import torch

from gdn_export.ops import causal_conv1d
from tests.ragged import conv_ragged_inputs


def _literal(x, w, b, s, silu):
    B, T, C = x.shape
    K = w.shape[1]
    xs = torch.cat([s.double(), x.double().transpose(1, 2)], -1)
    y = torch.zeros(B, T, C, dtype=torch.float64)
    for t in range(T):
        for j in range(K):
            y[:, t] += w[:, j].double() * xs[:, :, t + j]
    y = y + (0 if b is None else b.double())
    return torch.nn.functional.silu(y) if silu else y


@pytest.mark.parametrize("T", [1, 3, 17], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("K", [2, 4], ids=lambda k: f"K{k}")
@pytest.mark.parametrize("silu", [True, False], ids=["silu", "linear"])
def test_conv_matches_literal_loop(T, K, silu):
    B, C = 2, 6
    x, w, b, s = torch.randn(B, T, C), torch.randn(C, K), torch.randn(C), torch.randn(B, C, K - 1)
    y, s_new = causal_conv1d(x, w, b, s, silu)
    torch.testing.assert_close(y.double(), _literal(x, w, b, s, silu), atol=1e-5, rtol=1e-5)
    full = torch.cat([s, x.transpose(1, 2)], -1)
    torch.testing.assert_close(s_new, full[:, :, -(K - 1):])


def test_conv_state_chaining_equals_one_pass():
    x, w = torch.randn(2, 30, 5), torch.randn(5, 4)
    y, s = causal_conv1d(x, w)
    ys, st = [], None
    for t in range(30):
        y_t, st = causal_conv1d(x[:, t : t + 1], w, None, st)
        ys.append(y_t)
    torch.testing.assert_close(torch.cat(ys, 1), y)
    torch.testing.assert_close(st, s)


def test_conv_bad_state_shape():
    with pytest.raises(ValueError, match="conv_state must be"):
        causal_conv1d(torch.randn(1, 3, 4), torch.randn(4, 4), None, torch.randn(1, 4, 2))


# ----------------------------------------------------------------------------- ragged rows


def test_full_lengths_equal_no_lengths():
    x, w, b, s0, _ = conv_ragged_inputs([5, 5, 5], 5, 9, 4, torch.float32, "cpu")
    y, s = causal_conv1d(x, w, b, s0, False)
    y_l, s_l = causal_conv1d(x, w, b, s0, False, seq_lens=torch.full((3,), 5, dtype=torch.int64))
    assert torch.equal(y, y_l) and torch.equal(s, s_l)


@pytest.mark.parametrize("lengths,match", [([4, 5], r"\[0, T=4\]"), ([-1, 2], r"\[0, T=4\]"),
                                           ([1], "integer \\[B=2\\]")],
                         ids=["too-long", "negative", "wrong-shape"])
def test_bad_lengths_raise(lengths, match):
    x, w = torch.randn(2, 4, 3), torch.randn(3, 4)
    with pytest.raises(ValueError, match=match):
        causal_conv1d(x, w, seq_lens=torch.tensor(lengths, dtype=torch.int32))


def test_float_lengths_raise():
    with pytest.raises(ValueError, match="seq_lens must be integer"):
        causal_conv1d(torch.randn(2, 4, 3), torch.randn(3, 4), seq_lens=torch.tensor([1.0, 2.0]))
