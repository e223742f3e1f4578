"""Triton gated delta rule on right-padded batches (g = beta = 0 past each row's end) and with beta
in (0, 2), against the fp32 reference (see tests/ops/test_gated_delta_rule_padding.py)."""

import pytest
import torch

from gdn_export.ops.gated_delta_rule.naive import recurrent_gated_delta_rule
from tests.conftest import DTYPES, assert_close_rms, gdn_inputs
from tests.ragged import GDR_PADDED, check_gdr_rows, gdr_padded_inputs, pack, with_beta_up_to_2

from gdn_export.ops.gated_delta_rule.triton.chunk import chunk_gated_delta_rule
from gdn_export.ops.gated_delta_rule.triton.fused_recurrent import fused_recurrent_gated_delta_rule

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNELS = {"chunk": chunk_gated_delta_rule, "recurrent": fused_recurrent_gated_delta_rule}


def _run(kernel, x, cu_seqlens=None):
    B, T, _, Dk = x["q"].shape
    Hv, Dv = x["v"].shape[2:]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    o = torch.full((B, T, Hv, Dv), float("nan"), dtype=x["v"].dtype, device=DEVICE)
    s = torch.full((N, Hv, Dk, Dv), float("nan"), dtype=torch.float32, device=DEVICE)
    return KERNELS[kernel](**x, scale=Dk ** -0.5, use_qk_l2norm=True, cu_seqlens=cu_seqlens, out=o, final_state=s)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_right_padding_equals_each_row_alone(kernel, dtype):
    p = GDR_PADDED
    x = gdr_padded_inputs(p["lengths"], p["T"], p["Hk"], p["Hv"], p["Dk"], p["Dv"], dtype, DEVICE)
    o, s = _run(kernel, x)
    check_gdr_rows(o, s, x, p["lengths"], dtype, recurrent_gated_delta_rule)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_padded_rows_in_a_cu_seqlens_pack(kernel):
    p = GDR_PADDED
    x = gdr_padded_inputs(p["lengths"], p["T"], p["Hk"], p["Hv"], p["Dk"], p["Dv"], torch.bfloat16, DEVICE,
                          correlated=True)
    packed, cu = pack(x)
    o, s = _run(kernel, packed, cu)
    check_gdr_rows(o.reshape(x["v"].shape), s, x, p["lengths"], torch.bfloat16, recurrent_gated_delta_rule)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("correlated", [False, True], ids=["random", "model-like"])
@pytest.mark.parametrize("kernel,T", [("chunk", 130), ("chunk", 65), ("recurrent", 1), ("recurrent", 63)],
                         ids=["chunk-T130", "chunk-T65", "recurrent-T1", "recurrent-T63"])
def test_beta_up_to_2(kernel, T, correlated, dtype):
    x = with_beta_up_to_2(gdn_inputs(2, T, 1, 2, 16, 32, dtype=dtype, device=DEVICE, seed=T,
                                     correlated=correlated))
    o, s = _run(kernel, x)
    ref = {n: (t.cpu() if t is not None else None) for n, t in x.items()}
    ro, rs = recurrent_gated_delta_rule(**ref, scale=16 ** -0.5, use_qk_l2norm=True)
    assert_close_rms(o.cpu(), ro, dtype, "o")
    assert_close_rms(s.cpu(), rs, dtype, "final_state")
