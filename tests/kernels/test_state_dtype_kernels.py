"""Triton kernels with an fp16 / bf16 recurrent state against the reference with the same storage.

The reference rounds the state once per call where it is stored (the op's rounding rule); the
kernels must do the same: o and the state agree within the activation bound, and the state comes
back in the storage dtype. Runs under TRITON_INTERPRET=1 on CPU (conftest.py), on the GPU if any.
"""

import pytest
import torch

from gdn_export.ops.gated_delta_rule.naive import recurrent_gated_delta_rule
from tests.conftest import DTYPES, RMS_BOUND, gdn_inputs, rel_rms

from gdn_export.ops.gated_delta_rule.triton.chunk import chunk_gated_delta_rule
from gdn_export.ops.gated_delta_rule.triton.fused_recurrent import fused_recurrent_gated_delta_rule

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
STATE_DTYPES = [pytest.param(torch.float32, id="fp32-state"), pytest.param(torch.bfloat16, id="bf16-state"),
                pytest.param(torch.float16, id="fp16-state")]
KERNELS = {"chunk": chunk_gated_delta_rule, "recurrent": fused_recurrent_gated_delta_rule}
# Two roundings of nearly equal fp32 values land one 16-bit step apart now and then.
STATE_BOUND = {torch.float32: 0.0, torch.bfloat16: 6e-3, torch.float16: 1e-3}


def _check(kernel, x, dtype, state_dtype, cu_seqlens=None, correlated=False):
    B, T, Hk, Dk = x["q"].shape
    Hv, Dv = x["v"].shape[2:]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    x = dict(x, initial_state=x["initial_state"].to(state_dtype))
    o = torch.full((B, T, Hv, Dv), float("nan"), dtype=dtype, device=DEVICE)
    s = torch.full((N, Hv, Dk, Dv), float("nan"), dtype=state_dtype, device=DEVICE)
    o_out, s_out = KERNELS[kernel](**x, use_qk_l2norm=True, cu_seqlens=cu_seqlens, out=o, final_state=s)
    assert o_out.data_ptr() == o.data_ptr() and s_out.data_ptr() == s.data_ptr()
    ref = {n: t.cpu() for n, t in x.items()}
    ro, rs = recurrent_gated_delta_rule(**ref, use_qk_l2norm=True,
                                        cu_seqlens=None if cu_seqlens is None else cu_seqlens.cpu())
    assert rs.dtype == state_dtype
    bound = RMS_BOUND[dtype] * (2 if correlated else 1)
    assert rel_rms(o.cpu(), ro) <= bound, ("o", rel_rms(o.cpu(), ro))
    err = rel_rms(s.cpu(), rs)
    assert err <= max(bound, STATE_BOUND[state_dtype]), ("final_state", err)


@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel,B,T,Hk,Hv,Dk,Dv", [
    pytest.param("recurrent", 3, 1, 1, 2, 16, 32, id="recurrent-T1-B3-Hv2Hk-DkneDv"),
    pytest.param("recurrent", 1, 5, 2, 2, 32, 16, id="recurrent-T5-DkneDv"),
    pytest.param("chunk", 1, 63, 2, 2, 32, 16, id="chunk-T63-DkneDv"),
    pytest.param("chunk", 2, 130, 1, 2, 16, 16, id="chunk-T130-B2-Hv2Hk"),
])
def test_kernel_matches_reference_per_state_dtype(kernel, B, T, Hk, Hv, Dk, Dv, dtype, state_dtype):
    _check(kernel, gdn_inputs(B, T, Hk, Hv, Dk, Dv, dtype=dtype, device=DEVICE), dtype, state_dtype)


@pytest.mark.parametrize("state_dtype", STATE_DTYPES[1:])
@pytest.mark.parametrize("kernel,T,Dk,Dv", [pytest.param("chunk", 65, 64, 64, id="chunk-T65-D64"),
                                            pytest.param("recurrent", 1, 16, 16, id="recurrent-T1")])
def test_correlated_keys(kernel, T, Dk, Dv, state_dtype):
    x = gdn_inputs(2, T, 1, 2, Dk, Dv, dtype=torch.bfloat16, device=DEVICE, correlated=True)
    _check(kernel, x, torch.bfloat16, state_dtype, correlated=True)


@pytest.mark.parametrize("state_dtype", STATE_DTYPES[1:])
@pytest.mark.parametrize("kernel,lens", [pytest.param("chunk", [5, 65, 1, 70], id="chunk"),
                                         pytest.param("recurrent", [3, 1, 7], id="recurrent"),
                                         pytest.param("recurrent", [1, 1, 1, 1], id="decode-pack")])
def test_varlen_per_state_dtype(kernel, lens, state_dtype):
    x = gdn_inputs(1, sum(lens), 1, 2, 16, 32, dtype=torch.float16, device=DEVICE, state=False)
    x["initial_state"] = torch.randn(len(lens), 2, 16, 32, device=DEVICE) * 0.1
    cu = torch.tensor([0] + lens, device=DEVICE).cumsum(0)
    _check(kernel, x, torch.float16, state_dtype, cu_seqlens=cu)


@pytest.mark.parametrize("state_dtype", STATE_DTYPES[1:])
def test_decode_chain_in_place_rounds_like_the_reference(state_dtype):
    # 12 in-place decode steps on a 16-bit state: each step rounds once, as the reference does.
    x = gdn_inputs(2, 12, 1, 2, 16, 32, dtype=torch.bfloat16, device=DEVICE, correlated=True)
    state = x["initial_state"].to(state_dtype)
    ref_state = state.cpu().clone()  # .cpu() of a CPU tensor is the tensor: the kernel updates it
    for t in range(12):
        step = {n: val[:, t : t + 1] for n, val in x.items() if n != "initial_state"}
        o, s = fused_recurrent_gated_delta_rule(**step, initial_state=state, use_qk_l2norm=True, inplace=True)
        assert s is state
        ro, ref_state = recurrent_gated_delta_rule(**{n: v.cpu() for n, v in step.items()},
                                                   initial_state=ref_state, use_qk_l2norm=True)
        assert rel_rms(o.cpu(), ro) <= RMS_BOUND[torch.bfloat16]
    assert ref_state.dtype == state_dtype
    assert rel_rms(state.cpu(), ref_state) <= STATE_BOUND[state_dtype]


def test_triton_backend_returns_the_state_dtype():
    from gdn_export.ops import gated_delta_rule, use_backend

    x = gdn_inputs(1, 20, 1, 2, 16, 16, dtype=torch.bfloat16, device=DEVICE, state=False)
    with use_backend("triton"):
        _, s = gated_delta_rule(**x, use_qk_l2norm=True, state_dtype=torch.bfloat16)
        _, s1 = gated_delta_rule(**{n: v[:, :1] for n, v in x.items() if v is not None},
                                 initial_state=s, use_qk_l2norm=True)
    assert s.dtype == torch.bfloat16 and s1.dtype == torch.bfloat16
