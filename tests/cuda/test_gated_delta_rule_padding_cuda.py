"""CUDA gated delta rule kernels on right-padded batches (g = beta = 0 past each row's end) and with
beta in (0, 2), both kernel paths pinned, against the fp32 reference
(see tests/ops/test_gated_delta_rule_padding.py)."""

import pytest
import torch

from gdn_export.ops.gated_delta_rule.naive import recurrent_gated_delta_rule
from tests.conftest import DTYPES, GPU_ONLY, assert_close_rms, gdn_inputs
from tests.ragged import GDR_PADDED, check_gdr_rows, gdr_padded_inputs, pack, with_beta_up_to_2

pytestmark = GPU_ONLY

if torch.cuda.is_available():
    from gdn_export.cuda import backend as cuda_backend

PATHS = {"recurrent": 1, "chunked": 2}  # cuda_backend.PATH_RECURRENT / PATH_CHUNKED


def _run(x, path, cu_seqlens=None):
    B, T, _, Dk = x["q"].shape
    Hv, Dv = x["v"].shape[2:]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    o = torch.full((B, T, Hv, Dv), float("nan"), dtype=x["v"].dtype, device="cuda")
    s = torch.full((N, Hv, Dk, Dv), float("nan"), device="cuda")
    cuda_backend.gated_delta_rule_out(x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], Dk ** -0.5,
                                      True, cu_seqlens, o, s, path=PATHS[path])
    return o, s


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("correlated", [False, True], ids=["random", "model-like"])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
def test_right_padding_equals_each_row_alone(D, path, correlated, dtype):
    p = GDR_PADDED
    x = gdr_padded_inputs(p["lengths"], p["T"], 2, 4, D, D, dtype, "cuda", correlated=correlated)
    o, s = _run(x, path)
    check_gdr_rows(o, s, x, p["lengths"], dtype, recurrent_gated_delta_rule)


@pytest.mark.parametrize("path", list(PATHS))
def test_padded_rows_in_a_cu_seqlens_pack(path):
    p = GDR_PADDED
    x = gdr_padded_inputs(p["lengths"], p["T"], 2, 4, 128, 64, torch.bfloat16, "cuda", correlated=True)
    packed, cu = pack(x)
    o, s = _run(packed, path, cu)
    check_gdr_rows(o.reshape(x["v"].shape), s, x, p["lengths"], torch.bfloat16, recurrent_gated_delta_rule)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("correlated", [False, True], ids=["random", "model-like"])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("T", [1, 63, 130, 1000], ids=lambda t: f"T{t}")
def test_beta_up_to_2(T, path, correlated, dtype):
    x = with_beta_up_to_2(gdn_inputs(2, T, 2, 4, 128, 128, dtype=dtype, device="cuda", seed=T,
                                     correlated=correlated))
    o, s = _run(x, path)
    ref = {n: (t.cpu() if t is not None else None) for n, t in x.items()}
    ro, rs = recurrent_gated_delta_rule(**ref, scale=128 ** -0.5, use_qk_l2norm=True)
    assert_close_rms(o.cpu(), ro, dtype, "o")
    assert_close_rms(s.cpu(), rs, dtype, "final_state")
