"""Triton kernels with a 16-bit recurrent state at real sizes on a GPU (the contract suite,
tests/ops/gated_delta_rule, covers the odd shapes)."""

import pytest
import torch

from gdn_export.ops.gated_delta_rule.naive import chunked_gated_delta_rule, recurrent_gated_delta_rule
from tests.conftest import DTYPES, GPU_ONLY, RMS_BOUND, gdn_inputs, rel_rms

pytestmark = GPU_ONLY

STATE_DTYPES = [pytest.param(torch.bfloat16, id="bf16-state"), pytest.param(torch.float16, id="fp16-state")]
STATE_BOUND = {torch.bfloat16: 6e-3, torch.float16: 1e-3}


@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T", [(64, 1), (3, 10), (2, 1000), (1, 4097)], ids=lambda x: str(x))
def test_triton_backend_real_sizes(B, T, dtype, state_dtype):
    from gdn_export.ops import gated_delta_rule, use_backend

    x = gdn_inputs(B, T, 16, 32, 128, 128, dtype=dtype, device="cuda", correlated=T > 1000)
    x["initial_state"] = x["initial_state"].to(state_dtype)
    with use_backend("triton"):
        o, s = gated_delta_rule(**x, use_qk_l2norm=True)
    fn = recurrent_gated_delta_rule if T == 1 else chunked_gated_delta_rule
    ro, rs = fn(**x, use_qk_l2norm=True)
    assert s.dtype == rs.dtype == state_dtype
    assert rel_rms(o, ro) <= 2 * RMS_BOUND[dtype], ("o", rel_rms(o, ro))
    assert rel_rms(s, rs) <= max(2 * RMS_BOUND[dtype], STATE_BOUND[state_dtype]), ("state", rel_rms(s, rs))
