"""The gated delta rule's two facts the model relies on, on the fp32 reference (both naive forms):
right padding written as g = 0 and beta = 0 leaves the state exactly unchanged, and beta in (0, 2)
(allow_neg_eigval) is handled the same way by the chunked and the recurrent form."""

import pytest
import torch

from gdn_export.ops.gated_delta_rule.naive import chunked_gated_delta_rule, recurrent_gated_delta_rule
from tests.conftest import gdn_inputs
from tests.ragged import GDR_PADDED, check_gdr_rows, gdr_padded_inputs, pack, with_beta_up_to_2

FORMS = {"recurrent": recurrent_gated_delta_rule, "chunked": chunked_gated_delta_rule}


def _run(fn, x, cu_seqlens=None):
    return fn(**x, scale=x["q"].shape[-1] ** -0.5, use_qk_l2norm=True, cu_seqlens=cu_seqlens)


@pytest.mark.parametrize("correlated", [False, True], ids=["random", "model-like"])
@pytest.mark.parametrize("form", list(FORMS))
def test_right_padding_equals_each_row_alone(form, correlated):
    p = GDR_PADDED
    x = gdr_padded_inputs(p["lengths"], p["T"], p["Hk"], p["Hv"], p["Dk"], p["Dv"], torch.float32, "cpu",
                          correlated=correlated)
    o, s = _run(FORMS[form], x)
    check_gdr_rows(o, s, x, p["lengths"], torch.float32, FORMS[form], exact=True)


@pytest.mark.parametrize("form", list(FORMS))
def test_padded_rows_in_a_cu_seqlens_pack(form):
    p = GDR_PADDED
    x = gdr_padded_inputs(p["lengths"], p["T"], p["Hk"], p["Hv"], p["Dk"], p["Dv"], torch.float32, "cpu")
    packed, cu = pack(x)
    o, s = _run(FORMS[form], packed, cu)
    check_gdr_rows(o.reshape(x["v"].shape), s, x, p["lengths"], torch.float32, FORMS[form], exact=True)


def test_zero_gate_and_beta_is_an_identity_step():
    x = gdn_inputs(2, 7, 1, 2, 16, 8, seed=4)
    x["g"].zero_()
    x["beta"].zero_()
    _, s = _run(recurrent_gated_delta_rule, x)
    assert torch.equal(s, x["initial_state"])


@pytest.mark.parametrize("correlated", [False, True], ids=["random", "model-like"])
@pytest.mark.parametrize("T", [1, 63, 130], ids=lambda t: f"T{t}")
def test_beta_up_to_2_chunked_matches_recurrent(T, correlated):
    x = with_beta_up_to_2(gdn_inputs(2, T, 1, 2, 16, 32, seed=T, correlated=correlated))
    assert float(x["beta"].max()) > 1.0
    o_r, s_r = _run(recurrent_gated_delta_rule, x)
    o_c, s_c = _run(chunked_gated_delta_rule, x)
    assert torch.isfinite(o_r).all() and torch.isfinite(s_r).all()
    torch.testing.assert_close(o_c, o_r, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(s_c, s_r, atol=2e-5, rtol=1e-4)
