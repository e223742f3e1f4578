"""gdn::fp8_linear / fp8_block_linear / int4_linear references against an independent float64 numpy
implementation (ml_dtypes' float8_e4m3fn for the rounding), odd shapes, fp32 / fp16 / bf16 x.

Tolerance (relative RMS of y): fp32 x 1e-5 (same arithmetic, different summation order); 16-bit x
1e-2 (y is rounded to 16 bits; for fp8 the activation is quantized from the 16-bit x as it is).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from gdn_export.ops.quant_linear import check_int4, fp8_block_linear, fp8_linear, int4_linear

F8 = ml_dtypes.float8_e4m3fn
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
SHAPES = [pytest.param(1, 64, 48, id="M1-K64-N48"), pytest.param(63, 130, 65, id="M63-K130-N65"),
          pytest.param(65, 257, 129, id="M65-K257-N129"), pytest.param(130, 256, 384, id="M130-K256-N384")]
DTYPES = [pytest.param(d, id=str(d).removeprefix("torch.")) for d in TOL]


def np_e4m3(a: np.ndarray) -> np.ndarray:
    return np.clip(a, -448, 448).astype(F8).astype(np.float64)


def rel_rms(got: torch.Tensor, want: np.ndarray) -> float:
    got = got.double().numpy()
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want ** 2)))


def make_x(M, K, dtype, gen, model_like):
    x = torch.randn(M, K, generator=gen)
    if model_like:  # hidden states: a few outlier channels, as after an RMSNorm of a real model
        x[:, :3] *= 20
    return x.to(dtype)


@pytest.mark.parametrize("M,K,N", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("model_like", [False, True], ids=["randn", "outliers"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_fp8_linear(M, K, N, dtype, model_like, bias):
    gen = torch.Generator().manual_seed(M * 7 + K)
    x = make_x(M, K, dtype, gen, model_like)
    w = (torch.randn(N, K, generator=gen) * 0.05)
    weight_scale = w.abs().amax(1) / 448
    weight = (w / weight_scale[:, None]).to(torch.float8_e4m3fn)
    input_scale = x.float().abs().amax() / 448 * 0.7  # some values clip
    b = torch.randn(N, generator=gen).to(dtype) if bias else None
    y = fp8_linear(x, weight, weight_scale, input_scale, b)
    assert y.dtype == dtype and y.shape == (M, N)
    xs = x.double().numpy() / float(input_scale)
    want = (np_e4m3(xs) @ weight.float().double().numpy().T) * float(input_scale) * weight_scale.double().numpy()
    if bias:
        want = want + b.double().numpy()
    assert rel_rms(y, want) < TOL[dtype]


@pytest.mark.parametrize("M,K,N", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("model_like", [False, True], ids=["randn", "outliers"])
def test_fp8_block_linear(M, K, N, dtype, model_like):
    gen = torch.Generator().manual_seed(M + 3 * K)
    x = make_x(M, K, dtype, gen, model_like)
    nb, kb = -(-N // 128), -(-K // 128)
    weight = (torch.randn(N, K, generator=gen) * 100).to(torch.float8_e4m3fn)
    scale_inv = torch.rand(nb, kb, generator=gen) * 1e-3 + 1e-4
    y = fp8_block_linear(x, weight, scale_inv)
    # numpy: per token, per group of 128 along K, the products summed group by group
    xn, wn, sn = x.double().numpy(), weight.float().double().numpy(), scale_inv.double().numpy()
    want = np.zeros((M, N))
    for g in range(kb):
        cols = slice(128 * g, min(128 * g + 128, K))
        s = np.maximum(np.abs(xn[:, cols]).max(1), 1e-10) / 448
        xq = np_e4m3(xn[:, cols] / s[:, None])
        ws = np.repeat(sn[:, g], 128)[:N]
        want += (xq @ wn[:, cols].T) * s[:, None] * ws[None, :]
    assert rel_rms(y, want) < TOL[dtype]


@pytest.mark.parametrize("M,K,N", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group_size", [32, 128], ids=["g32", "g128"])
@pytest.mark.parametrize("awq", [False, True], ids=["rtn", "awq"])
def test_int4_linear(M, K, N, dtype, group_size, awq):
    gen = torch.Generator().manual_seed(M + K + N)
    x = make_x(M, K, dtype, gen, False)
    pre = torch.exp2(torch.rand(K, generator=gen) * 4 - 2).to(dtype) if awq else None
    q = np.random.default_rng(M + K).integers(-8, 8, size=(N, K))
    # ONNX INT4 packing written independently: low nibble even k, high nibble odd k
    qp = np.pad(q, ((0, 0), (0, K % 2))) & 0xF
    packed = torch.from_numpy((qp[:, 0::2] | (qp[:, 1::2] << 4)).astype(np.uint8))
    G = -(-K // group_size)
    scales = (torch.rand(N, G, generator=gen) * 0.01 + 1e-3).to(dtype)
    y = int4_linear(x, packed, scales, None, group_size, pre)
    if awq:  # the contract: x * pre_scale rounded to x's dtype, then the W4A16 product; the dispatcher too
        torch.testing.assert_close(torch.ops.gdn.int4_linear(x, packed, scales, None, group_size, pre), y,
                                   rtol=0, atol=0)
        x = (x.double() * pre.double()).to(dtype)
    W = q * np.repeat(scales.double().numpy(), group_size, axis=1)[:, :K]
    want = x.double().numpy() @ W.T
    assert rel_rms(y, want) < TOL[dtype]


def test_leading_dims_and_dispatcher_path():
    """[B, T, K] inputs, and the torch.ops path (what export / compile see) gives the same y."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 256, generator=gen)
    weight = torch.randn(64, 256, generator=gen).to(torch.float8_e4m3fn)
    s = torch.rand(1, 2, generator=gen)
    y = fp8_block_linear(x, weight, s)
    assert y.shape == (2, 3, 64)
    torch.testing.assert_close(torch.ops.gdn.fp8_block_linear(x, weight, s, None), y)
    fake = torch.library.opcheck(torch.ops.gdn.fp8_block_linear.default, (x, weight, s, None),
                                 test_utils=("test_faketensor", "test_aot_dispatch_static"))
    assert all(v == "SUCCESS" for v in fake.values())


@pytest.mark.parametrize("case,match", [
    ("scales_shape", "scales must be"), ("qweight_dtype", "qweight must be uint8"),
    ("odd_group", "group_size must be"), ("pre_scale_shape", "pre_scale must be"),
    ("pre_scale_dtype", "pre_scale must be"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_int4_contract_errors(case, match):
    x = torch.randn(2, 64)
    qweight, scales, g, pre = torch.zeros(8, 32, dtype=torch.uint8), torch.ones(8, 1), 64, None
    if case == "pre_scale_shape":
        pre = torch.ones(63)
    elif case == "pre_scale_dtype":
        pre = torch.ones(64, dtype=torch.bfloat16)
    elif case == "scales_shape":
        scales = torch.ones(8, 2)
    elif case == "qweight_dtype":
        qweight = qweight.to(torch.int8)
    else:
        g = 3
    with pytest.raises(ValueError, match=match):
        check_int4(x, qweight, scales, None, g, pre)
