"""gdn::gated_delta_rule_ (the in-place state update of the fast runner) on every backend that runs
here, against the functional op on the reference backend: same o, and the state buffer itself holds
the final state (decode T = 1 and a chunked prefill; Hv = 2 Hk, Dk != Dv, correlated keys)."""

import pytest
import torch

from gdn_export.ops import gated_delta_rule, use_backend
from gdn_export.ops.gated_delta_rule import gated_delta_rule_
from tests.conftest import assert_close_rms, gdn_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ["reference", "triton"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("T", [1, 65], ids=lambda t: f"T{t}")
def test_inplace_matches_functional(backend, T):
    x = gdn_inputs(2, T, 2, 4, 64, 128 if backend != "reference" else 48, seed=T, correlated=True)
    x = {k: v.to(DEVICE) for k, v in x.items()}
    with use_backend("reference"):
        want_o, want_state = gated_delta_rule(**x, use_qk_l2norm=True)
    state = x.pop("initial_state").clone()
    ptr = state.data_ptr()
    with use_backend(backend):
        o = gated_delta_rule_(**x, state=state, use_qk_l2norm=True)
    assert state.data_ptr() == ptr
    assert_close_rms(o, want_o, torch.float32, "o")
    assert_close_rms(state, want_state, torch.float32, "state")
