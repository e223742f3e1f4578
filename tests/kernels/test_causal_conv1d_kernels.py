"""Triton causal conv1d (prefill and single-step update) against the fp32 reference."""

import pytest
import torch

from gdn_export.ops.causal_conv1d.naive import causal_conv1d as reference
from tests.conftest import DTYPES, assert_close_rms
from tests.ragged import CONV_RAGGED, check_conv_rows, conv_ragged_inputs

from gdn_export.ops.causal_conv1d.triton import causal_conv1d

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = [
    # B, T, C, K, bias, state, silu
    pytest.param(1, 1, 64, 4, True, True, True, id="decode-T1"),
    pytest.param(3, 1, 300, 4, True, True, False, id="decode-B3-C300-nosilu"),
    pytest.param(3, 2, 40, 4, True, True, True, id="T2-shorter-than-state"),
    pytest.param(2, 65, 130, 3, False, True, True, id="T65-K3-nobias"),
    pytest.param(1, 130, 16, 4, True, False, True, id="T130-nostate"),
    pytest.param(2, 7, 8, 1, True, False, False, id="K1"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T,C,K,bias,state,silu", CASES)
def test_conv_matches_reference(B, T, C, K, bias, state, silu, dtype):
    x = torch.randn(B, T, C).to(DEVICE, dtype)
    w = (torch.randn(C, K) * 0.5).to(DEVICE, dtype)
    b = torch.randn(C).to(DEVICE, dtype) if bias else None
    s0 = torch.randn(B, C, K - 1).to(DEVICE, dtype) if state else None
    y = torch.full_like(x, float("nan"))
    s = torch.full((B, C, K - 1), float("nan"), dtype=dtype, device=DEVICE)
    causal_conv1d(x, w, b, s0, silu, out=y, new_conv_state=s)
    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
    ry, rs = reference(x.cpu(), w.cpu(), cpu(b), cpu(s0), silu)
    assert_close_rms(y.cpu(), ry, dtype, "y")
    if K > 1:
        assert_close_rms(s.cpu(), rs, dtype, "new_conv_state")


def test_prefill_then_decode_equals_one_pass():
    x = torch.randn(2, 40, 24, device=DEVICE)
    w, b = torch.randn(24, 4, device=DEVICE), torch.randn(24, device=DEVICE)
    y_all, s_all = causal_conv1d(x, w, b)
    y1, s1 = causal_conv1d(x[:, :39], w, b)
    y2, s2 = causal_conv1d(x[:, 39:], w, b, s1)
    assert_close_rms(torch.cat([y1, y2], 1).cpu(), y_all.cpu(), torch.float32, "y")
    assert torch.equal(s2, s_all)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [2, 3, 4], ids=lambda k: f"K{k}")
@pytest.mark.parametrize("case", list(CONV_RAGGED), ids=list(CONV_RAGGED))
def test_ragged_rows_equal_each_row_alone(case, K, dtype):
    T, lengths = CONV_RAGGED[case]
    x, w, b, s0, lens = conv_ragged_inputs(lengths, T, 37, K, dtype, DEVICE)
    y = torch.full_like(x, float("nan"))
    s = torch.full((len(lengths), 37, K - 1), float("nan"), dtype=dtype, device=DEVICE)
    causal_conv1d(x, w, b, s0, True, seq_lens=lens, out=y, new_conv_state=s)
    check_conv_rows(y, s, x, w, b, s0, lens, True, dtype)


def test_out_of_range_lengths_are_clamped():
    x, w, b, s0, _ = conv_ragged_inputs([6, 6, 6], 6, 5, 4, torch.float32, DEVICE)
    lens = torch.tensor([9, -3, 6], dtype=torch.int32, device=DEVICE)
    y, s = causal_conv1d(x, w, b, s0, True, seq_lens=lens)
    check_conv_rows(y, s, x, w, b, s0, torch.tensor([6, 0, 6]), True, torch.float32)
