"""The CUDA causal conv1d kernel (cuda backend) on a GPU, against the fp32 reference.

Prefill and single-step update, with and without bias / state / SiLU, odd channel counts, and the
in-place (aliased) state update where the new state overlaps what the kernel still has to read.
"""

import pytest
import torch

from gdn_export.ops.causal_conv1d.naive import causal_conv1d as conv_reference
from tests.conftest import DTYPES, GPU_ONLY, assert_close_rms
from tests.ragged import CONV_RAGGED, check_conv_rows, conv_ragged_inputs

pytestmark = GPU_ONLY

if torch.cuda.is_available():
    from gdn_export.cuda import backend as cuda_backend



def _inputs(B, T, C, K, dtype, bias=True, state=True):
    dev = "cuda"
    x = torch.randn(B, T, C, device=dev).to(dtype)
    w = (torch.randn(C, K, device=dev) * 0.5).to(dtype)
    b = (torch.randn(C, device=dev) * 0.1).to(dtype) if bias else None
    s = torch.randn(B, C, K - 1, device=dev).to(dtype) if state else None
    return x, w, b, s


def _run(x, w, b, s, silu):
    B, T, C = x.shape
    K = w.shape[1]
    y = torch.full((B, T, C), float("nan"), dtype=x.dtype, device="cuda")
    ns = torch.full((B, C, K - 1), float("nan"), dtype=x.dtype, device="cuda")
    cuda_backend.causal_conv1d_out(x, w, b, s, silu, y, ns)
    return y, ns


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [2, 4], ids=lambda k: f"K{k}")
@pytest.mark.parametrize("C", [64, 200], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("T", [1, 2, 3, 63, 64, 65, 1000], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("B", [1, 3], ids=lambda b: f"B{b}")
def test_grid(B, T, C, K, dtype):
    x, w, b, s = _inputs(B, T, C, K, dtype)
    y, ns = _run(x, w, b, s, True)
    ry, rs = conv_reference(x, w, b, s, True)
    assert_close_rms(y, ry, dtype, "y")
    assert_close_rms(ns, rs, dtype, "new_conv_state")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("silu", [True, False], ids=["silu", "linear"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("state", [True, False], ids=["state", "no-state"])
@pytest.mark.parametrize("T", [1, 100], ids=lambda t: f"T{t}")
def test_options(T, state, bias, silu, dtype):
    x, w, b, s = _inputs(2, T, 96, 4, dtype, bias=bias, state=state)
    y, ns = _run(x, w, b, s, silu)
    ry, rs = conv_reference(x, w, b, s, silu)
    assert_close_rms(y, ry, dtype, "y")
    assert_close_rms(ns, rs, dtype, "new_conv_state")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [1, 3, 8], ids=lambda k: f"K{k}")
@pytest.mark.parametrize("T", [1, 2, 5, 300], ids=lambda t: f"T{t}")
def test_inplace_state(T, K, dtype):
    x, w, b, s = _inputs(3, T, 130, K, dtype)
    ry, rs = conv_reference(x, w, b, s, True)
    y = cuda_backend.causal_conv1d_inplace(x, w, b, s, True)
    assert_close_rms(y, ry, dtype, "y")
    if K > 1:
        assert_close_rms(s, rs, dtype, "conv_state (in place)")


def test_decode_steps_match_prefill():
    x, w, b, s = _inputs(2, 20, 64, 4, torch.float32)
    ry, rs = conv_reference(x, w, b, s, True)
    state = s.clone()
    ys = [cuda_backend.causal_conv1d_inplace(x[:, t : t + 1], w, b, state, True) for t in range(20)]
    assert_close_rms(torch.cat(ys, 1), ry, torch.float32, "y (step by step)")
    assert_close_rms(state, rs, torch.float32, "conv_state")


def test_backend_entry_point():
    from gdn_export.ops import causal_conv1d, use_backend

    x, w, b, s = _inputs(2, 33, 64, 4, torch.bfloat16)
    with use_backend("cuda"):
        y, ns = causal_conv1d(x, w, b, s, True)
    ry, rs = conv_reference(x, w, b, s, True)
    assert_close_rms(y, ry, torch.bfloat16, "y")
    assert_close_rms(ns, rs, torch.bfloat16, "new_conv_state")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inplace", [False, True], ids=["separate", "in-place"])
@pytest.mark.parametrize("K", [2, 3, 4], ids=lambda k: f"K{k}")
@pytest.mark.parametrize("case", list(CONV_RAGGED), ids=list(CONV_RAGGED))
def test_ragged_rows_equal_each_row_alone(case, K, inplace, dtype):
    T, lengths = CONV_RAGGED[case]
    x, w, b, s0, lens = conv_ragged_inputs(lengths, T, 203, K, dtype, "cuda")
    y = torch.full_like(x, float("nan"))
    ns = s0.clone() if inplace else torch.full_like(s0, float("nan"))
    cuda_backend.causal_conv1d_out(x, w, b, ns if inplace else s0, True, y, ns, seq_lens=lens)
    check_conv_rows(y, ns, x, w, b, s0, lens, True, dtype)


def test_ragged_out_of_range_lengths_are_clamped():
    x, w, b, s0, _ = conv_ragged_inputs([6, 6, 6], 6, 64, 4, torch.float32, "cuda")
    y, ns = cuda_backend.causal_conv1d(x, w, b, s0, True, torch.tensor([9, -3, 6], dtype=torch.int32, device="cuda"))
    check_conv_rows(y, ns, x, w, b, s0, torch.tensor([6, 0, 6]), True, torch.float32)


def test_ragged_through_the_op():
    from gdn_export.ops import causal_conv1d, use_backend

    x, w, b, s0, lens = conv_ragged_inputs([33, 0, 7], 33, 64, 4, torch.bfloat16, "cuda")
    with use_backend("cuda"):
        y, ns = causal_conv1d(x, w, b, s0, True, seq_lens=lens)
    check_conv_rows(y, ns, x, w, b, s0, lens, True, torch.bfloat16)
