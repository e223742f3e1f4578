"""GPU only: the CUDA MoE kernels (through the cuda backend) against the fp32 reference."""

from __future__ import annotations

import pytest
import torch

from gdn_export.cuda import backend as cuda_backend
from gdn_export.errors import GdnExportError
from gdn_export.ops import moe, use_backend
from gdn_export.ops.moe.naive import moe as reference
from tests.conftest import DTYPES, GPU_ONLY, assert_close_rms
from tests.ops.test_moe_reference import moe_inputs

pytestmark = GPU_ONLY

CASES = {  # (N, H, E, I, top_k, norm)
    "N1-E4-k1": (1, 64, 4, 48, 1, True),
    "N7-E16-k4-nonorm": (7, 96, 16, 40, 4, False),
    "N65-E8-k2-I100": (65, 128, 8, 100, 2, True),
    "N130-E64-k8": (130, 256, 64, 96, 8, True),
    "decode-qwen35-B8": (8, 2048, 256, 512, 8, True),
    "prefill-qwen35-T300": (300, 2048, 256, 512, 8, True),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_cuda_moe_matches_reference(case, dtype):
    N, H, E, I, k, norm = case
    args = [t.cuda() for t in moe_inputs(N, H, E, I, dtype, seed=N + E)]
    with use_backend("cuda"):
        out = moe(*args, k, norm)
    assert out.dtype == dtype and out.shape == (N, H)
    expected = reference(*(t.cpu() for t in args), k, norm)
    assert_close_rms(out.float().cpu(), expected.float(), dtype, "out")


def test_cuda_moe_unrouted_experts_not_read():
    N, H, E, I = 5, 64, 8, 32
    hidden, logits, gate_up, down = moe_inputs(N, H, E, I)
    logits[:, 4:] = -30.0
    gate_up[4:], down[4:] = float("nan"), float("nan")
    out = cuda_backend.moe(hidden.cuda(), logits.cuda(), gate_up.cuda(), down.cuda(), 2, True)
    assert torch.isfinite(out).all()
    assert_close_rms(out.cpu(), reference(hidden, logits, gate_up, down, 2, True), torch.float32, "out")


def test_cuda_moe_too_many_experts_is_one_line():
    with pytest.raises(GdnExportError, match="E <= 1024"):
        cuda_backend.moe(*(t.cuda() for t in moe_inputs(2, 16, 1025, 8)), 2, True)
