"""GPU only: the Triton MoE kernels at real sizes (Qwen3.5-35B-A3B's layer) against the reference."""

from __future__ import annotations

import pytest

from gdn_export.ops.moe.naive import moe as reference
from gdn_export.ops.moe.triton import moe as triton_moe
from tests.conftest import DTYPES, GPU_ONLY, assert_close_rms
from tests.ops.test_moe_reference import moe_inputs

pytestmark = GPU_ONLY

CASES = {  # (N, H, E, I, top_k, norm)
    "decode-B1": (1, 2048, 256, 512, 8, True),
    "decode-B64": (64, 2048, 256, 512, 8, True),
    "prefill-T1000": (1000, 2048, 256, 512, 8, True),
    "N65-E16-k4-I100-nonorm": (65, 128, 16, 100, 4, False),
    "qwen3next-E512-k10": (33, 2048, 512, 512, 10, True),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_triton_moe_gpu(case, dtype):
    N, H, E, I, k, norm = case
    args = [t.cuda() for t in moe_inputs(N, H, E, I, dtype, seed=N)]
    out = triton_moe(*args, k, norm)
    expected = reference(*(t.cpu() for t in args), k, norm)
    assert_close_rms(out.float().cpu(), expected.float(), dtype, "out")
