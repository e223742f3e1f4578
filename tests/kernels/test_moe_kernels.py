"""Triton MoE (routing + grouped GEMM) against the fp32 reference, on CPU under TRITON_INTERPRET=1
(tiny sizes; tests/kernels/test_gpu_kernels_moe.py runs real sizes on a GPU)."""

from __future__ import annotations

import pytest
import torch

from gdn_export.ops.moe.naive import moe as reference
from gdn_export.ops.moe.naive import route
from gdn_export.ops.moe.triton import moe as triton_moe
from tests.conftest import DTYPES, assert_close_rms
from tests.ops.test_moe_reference import moe_inputs

CASES = {  # (N, H, E, I, top_k, norm)
    "N1-E4-k1": (1, 16, 4, 16, 1, True),
    "N7-E8-k2-I24-nonorm": (7, 32, 8, 24, 2, False),
    "N65-E16-k4-I20": (65, 16, 16, 20, 4, True),
    "N7-E5-k3-H40": (7, 40, 5, 16, 3, True),
    "N300-E12-k4-prefill_tiles": (300, 24, 12, 20, 4, True),  # 1200 pairs: the 64-row prefill tiles
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_triton_moe_matches_reference(case, dtype):
    N, H, E, I, k, norm = case
    hidden, logits, gate_up, down = moe_inputs(N, H, E, I, dtype, seed=N + E)
    out, ids, weights = triton_moe(hidden, logits, gate_up, down, k, norm, return_routing=True)
    expected = reference(hidden, logits, gate_up, down, k, norm)
    assert out.dtype == dtype and out.shape == (N, H)
    assert_close_rms(out.float(), expected.float(), dtype, "out")
    ref_ids, ref_w = route(logits, k, norm)
    torch.testing.assert_close(ids.long(), ref_ids)
    torch.testing.assert_close(weights, ref_w, atol=1e-6, rtol=1e-5)


def test_unrouted_experts_are_never_read():
    """NaN in the weights of experts no token picks must not reach the output."""
    N, H, E, I = 5, 16, 8, 16
    hidden, logits, gate_up, down = moe_inputs(N, H, E, I)
    logits[:, 4:] = -30.0
    gate_up[4:], down[4:] = float("nan"), float("nan")
    out = triton_moe(hidden, logits, gate_up, down, 2, True)
    assert torch.isfinite(out).all()
    assert_close_rms(out, reference(hidden, logits, gate_up, down, 2, True), torch.float32, "out")


def test_through_the_public_op():
    from gdn_export.ops import moe, use_backend

    args = moe_inputs(9, 16, 6, 16, torch.bfloat16)
    with use_backend("triton"):
        out = moe(*args, 2, True)
    assert_close_rms(out.float(), reference(*args, 2, True).float(), torch.bfloat16, "out")
