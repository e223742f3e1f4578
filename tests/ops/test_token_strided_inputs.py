"""q / k / v and the conv's input as channel slices of a wider [B, T, C] tensor (what a GatedDeltaNet
layer passes: the conv's output split into q | k | v, the fused projection's output split into
qkv | z | b | a): the Triton kernels read them in place through their token stride and give the
same outputs as on contiguous copies (bit for bit under the interpreter; compiled, Triton specialises
a kernel on its strides' divisibility by 16, which may order the fp32 arithmetic differently: there
within a tenth of the dtype's bound), and match the fp32 reference.

Under TRITON_INTERPRET=1 on a CPU-only machine (conftest.py); with a GPU, on it.
"""

import pytest
import torch
import torch.nn.functional as F

from gdn_export.ops.gated_delta_rule.naive import recurrent_gated_delta_rule
from tests.conftest import RMS_BOUND, assert_close_rms, rel_rms

from kernels.causal_conv1d.triton.conv import causal_conv1d
from kernels.gated_delta_rule.triton.chunk import chunk_gated_delta_rule
from kernels.gated_delta_rule.triton.fused_recurrent import fused_recurrent_gated_delta_rule
from kernels.triton_utils import as_token_input, token_stride

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNELS = {"chunk": chunk_gated_delta_rule, "recurrent": fused_recurrent_gated_delta_rule}
CASES = [
    # B, T, Hk, Hv, Dk, Dv, cu_seqlens
    pytest.param(1, 1, 2, 2, 16, 16, None, id="decode-B1"),
    pytest.param(3, 1, 2, 4, 16, 32, None, id="decode-B3-Hv2Hk-DkneDv"),
    pytest.param(3, 5, 1, 2, 16, 32, None, id="T5-B3-Hv2Hk"),
    pytest.param(2, 67, 2, 2, 32, 16, None, id="T67-B2-DkneDv"),
    pytest.param(1, 75, 1, 3, 16, 16, (0, 11, 11, 75), id="varlen-3seqs-empty-Hv3Hk"),
]
if torch.cuda.is_available():  # the models' head sizes, compiled (`-m gpu` selects these)
    CASES += [pytest.param(*c, id=i, marks=pytest.mark.gpu) for c, i in (
        ((4, 1, 16, 32, 128, 128, None), "gpu-decode-B4-Hk16-Hv32-D128"),
        ((2, 300, 16, 32, 128, 128, None), "gpu-T300-B2-Hk16-Hv32-D128"),
        ((1, 1000, 2, 6, 128, 128, (0, 1, 64, 700, 1000)), "gpu-varlen-4seqs-Hv3Hk-D128"))]


def _assert_same(x, contiguous, dtype, name):
    """The same arithmetic, only the addresses differ (see the module docstring for the GPU)."""
    if DEVICE == "cpu":
        assert torch.equal(x, contiguous), f"{name}: strided input changed the result"
    else:
        err = rel_rms(x, contiguous)
        assert err <= RMS_BOUND[dtype] / 10, f"{name}: strided vs contiguous relative RMS {err:.3g}"


def _sliced_qkv(B, T, Hk, Hv, Dk, Dv, dtype, gen):
    """q, k, v as slices of one [B, T, Hk Dk + Hk Dk + Hv Dv + 7] tensor (7 extra channels, as z / b /
    a would be, so the token stride is not the sum of the three widths)."""
    widths = [Hk * Dk, Hk * Dk, Hv * Dv, 7]
    mixed = torch.randn(B, T, sum(widths), generator=gen)
    mixed[..., Hk * Dk:2 * Hk * Dk] = F.silu(mixed[..., Hk * Dk:2 * Hk * Dk] + 2.0)  # correlated keys
    mixed = mixed.to(dtype).to(DEVICE)
    q, k, v, _ = torch.split(mixed, widths, dim=-1)
    return q.reshape(B, T, Hk, Dk), k.reshape(B, T, Hk, Dk), v.reshape(B, T, Hv, Dv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("B,T,Hk,Hv,Dk,Dv,cu", CASES)
def test_gated_delta_rule_reads_slices_in_place(kernel, B, T, Hk, Hv, Dk, Dv, cu, dtype):
    gen = torch.Generator().manual_seed(B * 1000 + T)
    q, k, v = _sliced_qkv(B, T, Hk, Hv, Dk, Dv, dtype, gen)
    for x in (q, k, v):
        assert (B * T == 1 or not x.is_contiguous()) and token_stride(x) is not None and as_token_input(x, dtype) is x
    g = (-F.softplus(torch.randn(B, T, Hv, generator=gen)) * 0.3).to(DEVICE)
    beta = torch.sigmoid(torch.randn(B, T, Hv, generator=gen)).to(dtype).to(DEVICE)
    cu_seqlens = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    N = B if cu is None else len(cu) - 1
    h0 = (torch.randn(N, Hv, Dk, Dv, generator=gen) * 0.1).to(DEVICE)
    outs = []
    for args in ((q, k, v), (q.contiguous(), k.contiguous(), v.contiguous())):
        o = torch.full((B, T, Hv, Dv), float("nan"), dtype=dtype, device=DEVICE)
        s = torch.full_like(h0, float("nan"))
        KERNELS[kernel](*args, g, beta, h0, use_qk_l2norm=True, cu_seqlens=cu_seqlens, out=o, final_state=s)
        outs.append((o, s))
    (o, s), (oc, sc) = outs
    _assert_same(o, oc, dtype, "o")
    _assert_same(s, sc, dtype, "final_state")
    ref = [t.cpu() for t in (q, k, v, g, beta, h0)]
    ro, rs = recurrent_gated_delta_rule(*ref, use_qk_l2norm=True, cu_seqlens=None if cu is None else cu_seqlens.cpu())
    assert_close_rms(o.cpu(), ro, dtype, "o")
    assert_close_rms(s.cpu(), rs, dtype, "final_state")


@pytest.mark.parametrize("shape", [pytest.param((2, 5, 3, 4), id="contiguous"),
                                   pytest.param((1, 1, 3, 4), id="one-token")])
def test_token_stride_of_contiguous(shape):
    x = torch.zeros(shape)
    assert token_stride(x) == shape[2] * shape[3]


def test_token_stride_rejects_unpacked_heads():
    x = torch.zeros(2, 5, 4, 3).transpose(2, 3)  # heads not packed within a token
    assert token_stride(x) is None
    assert as_token_input(x, torch.float32).is_contiguous()
    y = torch.zeros(5, 2, 12)[:, :, :6].transpose(0, 1).reshape(2, 5, 2, 3)  # batch rows not T tokens apart
    assert token_stride(y) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("B,T,state", [
    pytest.param(3, 1, True, id="decode-B3"),
    pytest.param(2, 70, True, id="T70-B2-state"),
    pytest.param(1, 9, False, id="T9-no-state"),
])
def test_conv_reads_slice_in_place(B, T, state, dtype):
    gen = torch.Generator().manual_seed(T)
    C, K = 40, 4
    wide = torch.randn(B, T, C + 13, generator=gen).to(dtype).to(DEVICE)
    x = wide[..., 5:5 + C]  # a channel slice: tokens C + 13 apart
    weight = torch.randn(C, K, generator=gen).to(DEVICE)
    conv_state = (torch.randn(B, C, K - 1, generator=gen).to(dtype).to(DEVICE)) if state else None
    lens = torch.tensor([T] + [max(T - 3, 0)] * (B - 1), dtype=torch.int32, device=DEVICE)
    y, s = causal_conv1d(x, weight, None, conv_state, silu=True, seq_lens=lens)
    yc, sc = causal_conv1d(x.contiguous(), weight, None, conv_state, silu=True, seq_lens=lens)
    _assert_same(y, yc, dtype, "y")
    _assert_same(s, sc, dtype, "conv_state")
    xs = torch.cat([conv_state.float().cpu() if state else torch.zeros(B, C, K - 1), x.float().cpu().transpose(1, 2)], 2)
    want = F.silu(F.conv1d(xs, weight.float().cpu()[:, None], groups=C)).transpose(1, 2)
    assert_close_rms(y.float().cpu(), want, dtype, "y")
