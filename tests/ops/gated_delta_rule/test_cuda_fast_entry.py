"""The public op's fast entries on the cuda backend (gdn_export.ops.gated_delta_rule.cuda.*_fast): on a GPU, the
eager op calls the extension with no Python checks where nothing needs a cast, and falls back to the
checked entry otherwise. Each case against the checked entry (bit-equal: the same kernels) or the
fp32 reference, with outputs poisoned; bad input still ends in the checked entry's one-line error."""

import pytest
import torch

from gdn_export.errors import GdnExportError
from gdn_export.ops import gated_delta_rule, use_backend
from gdn_export.ops.gated_delta_rule import gated_delta_rule_
from tests.conftest import GPU_ONLY, assert_close_rms, gdn_inputs
from tests.ops.gated_delta_rule._cuda_cases import _reference

pytestmark = GPU_ONLY

if torch.cuda.is_available():
    from gdn_export.cuda.extension import load
    from gdn_export.ops.gated_delta_rule import cuda as cuda_backend

CASES = [  # B, T, Hk, Hv, Dk, Dv, dtype, state dtype
    pytest.param(3, 1, 2, 4, 128, 128, torch.bfloat16, torch.float32, id="decode-bf16-state32"),
    pytest.param(5, 1, 1, 3, 64, 40, torch.float16, torch.bfloat16, id="decode-fp16-state-bf16-Dv40"),
    pytest.param(2, 130, 2, 6, 128, 128, torch.bfloat16, torch.bfloat16, id="prefill-bf16-Hv3Hk"),
    pytest.param(1, 77, 1, 1, 32, 96, torch.float32, torch.float32, id="prefill-fp32-Dk32-Dv96"),
]


def _x(B, T, Hk, Hv, Dk, Dv, dtype, sdtype, correlated=False):
    x = gdn_inputs(B, T, Hk, Hv, Dk, Dv, dtype=dtype, device="cuda", correlated=correlated)
    x["initial_state"] = x["initial_state"].to(sdtype)
    return x


@pytest.mark.parametrize("B,T,Hk,Hv,Dk,Dv,dtype,sdtype", CASES)
def test_fast_entry_equals_checked_entry_and_reference(B, T, Hk, Hv, Dk, Dv, dtype, sdtype):
    x = _x(B, T, Hk, Hv, Dk, Dv, dtype, sdtype, correlated=True)
    load()
    with use_backend("cuda"):
        o, s = gated_delta_rule(**x, use_qk_l2norm=True)
    co, cs = cuda_backend.gated_delta_rule(**x, scale=Dk ** -0.5, use_qk_l2norm=True, cu_seqlens=None)
    assert o.dtype == dtype and s.dtype == sdtype
    assert torch.equal(o, co) and torch.equal(s, cs)
    ro, rs = _reference(dict(x, initial_state=x["initial_state"].float()))
    assert_close_rms(o, ro, dtype, "o")
    assert_close_rms(s.float(), rs, sdtype if sdtype != torch.float32 else dtype, "final_state")


@pytest.mark.parametrize("B,T,Hk,Hv,Dk,Dv,dtype,sdtype", CASES[:3])
def test_fast_inplace_entry_updates_the_state_where_it_lies(B, T, Hk, Hv, Dk, Dv, dtype, sdtype):
    x = _x(B, T, Hk, Hv, Dk, Dv, dtype, sdtype)
    load()
    _, expected = cuda_backend.gated_delta_rule(**x, scale=Dk ** -0.5, use_qk_l2norm=True, cu_seqlens=None)
    state = x["initial_state"].clone()
    ptr = state.data_ptr()
    with use_backend("cuda"):
        o = gated_delta_rule_(x["q"], x["k"], x["v"], x["g"], x["beta"], state, use_qk_l2norm=True)
    assert state.data_ptr() == ptr and torch.equal(state, expected)
    ro, _ = _reference(dict(x, initial_state=x["initial_state"].float()))
    assert_close_rms(o, ro, dtype, "o")


def test_views_and_casts_give_the_checked_results():
    """q, k, v as views of one projection (not contiguous) take the fast entry with copies; g in bf16
    and beta in fp32 need casts, so the op falls back to the checked entry: same results either way."""
    B, T, Hk, Hv, D = 2, 1, 2, 4, 64
    qkv = torch.randn(B, T, (2 * Hk + Hv) * D, device="cuda", dtype=torch.bfloat16)
    q, k, v = (t.reshape(B, T, -1, D) for t in qkv.split([Hk * D, Hk * D, Hv * D], dim=-1))
    assert not q.is_contiguous()
    g = -torch.rand(B, T, Hv, device="cuda") * 0.1
    beta = torch.rand(B, T, Hv, device="cuda").to(torch.bfloat16)
    s0 = torch.randn(B, Hv, D, D, device="cuda") * 0.1
    load()
    expected = cuda_backend.gated_delta_rule(q.contiguous(), k.contiguous(), v.contiguous(), g, beta, s0, D ** -0.5,
                                             True, None)
    with use_backend("cuda"):
        got = gated_delta_rule(q, k, v, g, beta, s0, use_qk_l2norm=True)
        cast = gated_delta_rule(q, k, v, g.to(torch.bfloat16), beta.float(), s0, use_qk_l2norm=True)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    assert cast[0].dtype == torch.bfloat16
    assert_close_rms(cast[0], expected[0], torch.bfloat16, "o with casts")


def test_bad_input_is_the_checked_one_line_error():
    """A shape the extension refuses makes the fast entry decline; the checked entry names it."""
    x = _x(2, 1, 2, 4, 64, 64, torch.bfloat16, torch.float32)
    load()
    with use_backend("cuda"):
        with pytest.raises(ValueError, match=r"^initial_state must be \[N, Hv, Dk, Dv\]"):
            gated_delta_rule(**dict(x, initial_state=x["initial_state"][:, :2].contiguous()))
        with pytest.raises(ValueError, match=r"^g must be \[B, T, Hv\]"):
            gated_delta_rule_(x["q"], x["k"], x["v"], x["g"][:, :, :2].contiguous(), x["beta"], x["initial_state"])
        with pytest.raises(ValueError, match=r"^beta must be \[B, T, Hv\]"):
            gated_delta_rule(**dict(x, beta=x["beta"][:1].contiguous()))
        with pytest.raises(GdnExportError, match="needs CUDA tensors"):
            gated_delta_rule(**dict(x, g=x["g"].cpu()))


def test_fast_entry_captures_in_a_cuda_graph():
    x = _x(4, 1, 2, 4, 128, 128, torch.bfloat16, torch.bfloat16)
    load()
    state = x["initial_state"].clone()
    with use_backend("cuda"):
        gated_delta_rule_(x["q"], x["k"], x["v"], x["g"], x["beta"], state.clone())  # warm-up
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o = gated_delta_rule_(x["q"], x["k"], x["v"], x["g"], x["beta"], state)
        o.fill_(float("nan"))
        state.copy_(x["initial_state"])
        graph.replay()
    _, expected = cuda_backend.gated_delta_rule(**x, scale=128 ** -0.5, use_qk_l2norm=False, cu_seqlens=None)
    assert torch.equal(state, expected)
    assert not o.isnan().any()
