"""The Triton kernels on a CUDA GPU at realistic head sizes (skipped without one).

Grid: T in {1, 63, 64, 65, 1000, 4097} x D in {64, 128} x Hv in {Hk, 2 Hk} x B in {1, 3} x
{fp32, bf16, fp16}, against the fp32 reference computed on the same GPU; packed sequences
against the per-sequence reference; in-place decode.
"""

import pytest
import torch

from gdn_export.ops.causal_conv1d.naive import causal_conv1d as conv_reference
from gdn_export.ops.gated_delta_rule.naive import chunked_gated_delta_rule, recurrent_gated_delta_rule
from tests.conftest import DTYPES, GPU_ONLY, assert_close_rms, gdn_inputs

pytestmark = GPU_ONLY

if torch.cuda.is_available():
    from gdn_export.ops import triton_backend as backend
    from gdn_export.ops.causal_conv1d.triton import causal_conv1d
    from gdn_export.ops.gated_delta_rule.triton.chunk import chunk_gated_delta_rule
    from gdn_export.ops.gated_delta_rule.triton.fused_recurrent import fused_recurrent_gated_delta_rule

HEADS = [pytest.param(2, 2, id="Hv=Hk"), pytest.param(2, 4, id="Hv=2Hk")]


def _reference(x, cu_seqlens=None):
    fn = recurrent_gated_delta_rule if x["v"].shape[1] <= 65 else chunked_gated_delta_rule
    return fn(**x, use_qk_l2norm=True, cu_seqlens=cu_seqlens)


def _run(fn, x, cu_seqlens=None):
    B, T, _, Dk = x["q"].shape
    Hv, Dv = x["v"].shape[2:]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    o = torch.full((B, T, Hv, Dv), float("nan"), dtype=x["v"].dtype, device="cuda")
    s = torch.full((N, Hv, Dk, Dv), float("nan"), device="cuda")
    fn(**x, use_qk_l2norm=True, cu_seqlens=cu_seqlens, out=o, final_state=s)
    return o, s


def _check(fn, x, dtype, cu_seqlens=None):
    """fn's o and final state (NaN-poisoned outputs) against the fp32 reference."""
    o, s = _run(fn, x, cu_seqlens=cu_seqlens)
    ro, rs = _reference(x, cu_seqlens)
    assert_close_rms(o, ro, dtype, "o")
    assert_close_rms(s, rs, dtype, "final_state")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B", [1, 3], ids=lambda b: f"B{b}")
@pytest.mark.parametrize("Hk,Hv", HEADS)
@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
@pytest.mark.parametrize("T", [1, 63, 64, 65, 1000, 4097], ids=lambda t: f"T{t}")
def test_chunk_grid(T, D, Hk, Hv, B, dtype):
    x = gdn_inputs(B, T, Hk, Hv, D, D, dtype=dtype, device="cuda")
    _check(chunk_gated_delta_rule, x, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
@pytest.mark.parametrize("T", [65, 1000, 4097], ids=lambda t: f"T{t}")
def test_chunk_correlated_keys(T, D, dtype):
    # keys as models make them (see gdn_inputs): the WY inverse must stay accurate on tensor cores
    x = gdn_inputs(2, T, 2, 4, D, D, dtype=dtype, device="cuda", correlated=True)
    _check(chunk_gated_delta_rule, x, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B", [1, 3], ids=lambda b: f"B{b}")
@pytest.mark.parametrize("Hk,Hv", HEADS)
@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
@pytest.mark.parametrize("T", [1, 63, 64, 65], ids=lambda t: f"T{t}")
def test_recurrent_grid(T, D, Hk, Hv, B, dtype):
    x = gdn_inputs(B, T, Hk, Hv, D, D, dtype=dtype, device="cuda")
    _check(fused_recurrent_gated_delta_rule, x, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dk_ne_dv_through_backend(dtype):
    for T in (1, 300):
        x = gdn_inputs(2, T, 2, 4, 128, 64, dtype=dtype, device="cuda")
        o, s = backend.gated_delta_rule(**x, scale=0.1, use_qk_l2norm=True, cu_seqlens=None)
        ro, rs = recurrent_gated_delta_rule(**x, scale=0.1, use_qk_l2norm=True)
        assert_close_rms(o, ro, dtype, f"o T={T}")
        assert_close_rms(s, rs, dtype, f"final_state T={T}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens", [
    pytest.param([1000, 1, 64, 65, 4097], id="prefill"),
    pytest.param([1, 3, 16, 2], id="decode"),
])
def test_varlen_pack(lens, dtype):
    x = gdn_inputs(1, sum(lens), 2, 4, 128, 128, dtype=dtype, device="cuda", state=False)
    x["initial_state"] = torch.randn(len(lens), 4, 128, 128, device="cuda") * 0.1
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0)
    fn = chunk_gated_delta_rule if max(lens) > 16 else fused_recurrent_gated_delta_rule
    _check(fn, x, dtype, cu_seqlens=cu)


@pytest.mark.parametrize("dtype", DTYPES)
def test_inplace_decode(dtype):
    x = gdn_inputs(64, 1, 16, 32, 128, 128, dtype=dtype, device="cuda")
    ro, rs = recurrent_gated_delta_rule(**x, use_qk_l2norm=True)
    state = x["initial_state"]
    ptr = state.data_ptr()
    o, s = fused_recurrent_gated_delta_rule(**x, use_qk_l2norm=True, inplace=True)
    assert s is state and state.data_ptr() == ptr
    assert_close_rms(o, ro, dtype, "o")
    assert_close_rms(state, rs, dtype, "state (in place)")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 4097], ids=lambda t: f"T{t}")
def test_conv(T, dtype):
    B, C, K = 3, 2048 + 64, 4
    x = torch.randn(B, T, C, device="cuda").to(dtype)
    w, b = torch.randn(C, K, device="cuda").to(dtype) * 0.5, torch.randn(C, device="cuda").to(dtype)
    s0 = torch.randn(B, C, K - 1, device="cuda").to(dtype)
    y, s = causal_conv1d(x, w, b, s0, True, out=torch.full_like(x, float("nan")))
    ry, rs = conv_reference(x, w, b, s0, True)
    assert_close_rms(y, ry, dtype, "y")
    assert_close_rms(s, rs, dtype, "new_conv_state")
