"""The FP8 K/V cache ops on the CPU against independent fp32 / fp64 oracles.

* kv_quantize: against ml_dtypes' float8_e4m3fn rounding of clip(x / scale, +-448) (a separate
  implementation of e4m3 round-to-nearest-even), including saturation and values on ties.
* write_kv_cache_fp8_: NaN-poisoned caches, ragged rows; written slots hold the quantized values,
  every other byte is untouched.
* attention_fp8: against an fp64 softmax over the dequantized cache (GQA, masks, unread slots
  poisoned with 448), fp32 exactly (1e-5), fp16 / bf16 within their output rounding.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from gdn_export.ops.attention.kv_fp8 import (FP8, FP8_MAX, attention_fp8, kv_dequantize, kv_quantize,
                                             write_kv_cache_fp8_)

NAN_BYTE = 0x7F  # e4m3fn NaN
MAX_BYTE = 0x7E  # e4m3fn 448
# (B, H, Hkv, S, L, D): Hv = 2 Hk style GQA, odd S / L, D not a power of two
SHAPES = [pytest.param(1, 2, 1, 1, 16, 16, id="decode-B1"), pytest.param(2, 4, 2, 63, 80, 24, id="S63-D24"),
          pytest.param(3, 8, 2, 65, 130, 32, id="S65-L130-G4"), pytest.param(2, 2, 2, 1, 130, 8, id="decode-MHA")]
# relative RMS of o against the fp64 oracle over the same dequantized cache (q rounded to dtype):
# fp32 is the same arithmetic (measured <= 4.8e-7 over SHAPES); fp16 / bf16 add the rounding of the
# dequantized K / V and of o to the dtype (measured <= 6.9e-4 / 5.0e-3).
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def oracle_quantize(x: torch.Tensor, scale: float) -> np.ndarray:
    """e4m3 codes (as float32 values) by ml_dtypes, fp32 division as the op's contract says."""
    y = np.clip(x.float().numpy() / np.float32(scale), -FP8_MAX, FP8_MAX).astype(np.float32)
    return y.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_quantize_matches_ml_dtypes(dtype):
    gen = torch.Generator().manual_seed(0)
    scale = 0.0137
    x = (torch.randn(4, 3, 65, 24, generator=gen) * 2.0).to(dtype)
    x.view(-1)[:6] = torch.tensor([1e6, -1e6, 448 * scale * 1.01, -448 * scale, 0.0, -0.0]).to(dtype)
    q = kv_quantize(x, scale)
    assert q.dtype == FP8 and q.shape == x.shape
    np.testing.assert_array_equal(q.float().numpy(), oracle_quantize(x, scale))
    assert q.float().abs().max() == FP8_MAX  # saturated, never NaN
    assert not torch.isnan(q.float()).any()


def test_dequantize_is_code_times_scale():
    codes = torch.arange(256, dtype=torch.uint8).view(FP8)
    finite = ~torch.isnan(codes.float())
    for dtype in (torch.float32, torch.bfloat16):
        got = kv_dequantize(codes, 0.25, dtype)
        want = (codes.float().double() * 0.25).to(dtype)
        assert got.dtype == dtype
        torch.testing.assert_close(got[finite], want[finite], atol=0, rtol=0)


@pytest.mark.parametrize("S", [1, 63, 65], ids=lambda s: f"S{s}")
def test_write_poisoned_cache_ragged_rows(S):
    gen = torch.Generator().manual_seed(S)
    B, Hkv, L, D = 3, 2, 140, 24
    kc = torch.full((B, Hkv, L, D), NAN_BYTE, dtype=torch.uint8).view(FP8)
    vc = kc.clone()
    k, v = torch.randn(B, Hkv, S, D, generator=gen), 3 * torch.randn(B, Hkv, S, D, generator=gen)
    idx = torch.tensor([0, 7, L - S])
    write_kv_cache_fp8_(kc, vc, k, v, idx, 0.01, 0.03)
    kb, vb = kc.view(torch.uint8), vc.view(torch.uint8)
    for b in range(B):
        lo = int(idx[b])
        np.testing.assert_array_equal(kc[b, :, lo:lo + S].float().numpy(), oracle_quantize(k[b], 0.01))
        np.testing.assert_array_equal(vc[b, :, lo:lo + S].float().numpy(), oracle_quantize(v[b], 0.03))
        for buf in (kb, vb):
            assert (buf[b, :, :lo] == NAN_BYTE).all() and (buf[b, :, lo + S:] == NAN_BYTE).all()


def test_write_refuses_a_16bit_cache():
    c = torch.zeros(1, 1, 4, 8)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        write_kv_cache_fp8_(c, c.clone(), torch.zeros(1, 1, 1, 8), torch.zeros(1, 1, 1, 8), torch.zeros(1, dtype=torch.long),
                            1.0, 1.0)


def oracle_attention(q, kc, vc, mask, scale, ks, vs):
    """fp64 masked GQA softmax attention over the dequantized cache; rows that read nothing: 0."""
    B, H, S, D = q.shape
    Hkv = kc.shape[1]
    K = kc.double() * ks
    V = vc.double() * vs
    K = torch.nan_to_num(K.repeat_interleave(H // Hkv, 1), nan=0.0)  # unread slots are masked below
    V = torch.nan_to_num(V.repeat_interleave(H // Hkv, 1), nan=0.0)
    s = torch.einsum("bhsd,bhld->bhsl", q.double(), K) * scale
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("bhsl,bhld->bhsd", p, V)


def _inputs(B, H, Hkv, S, L, D, seed, model_like: bool, poison: int = MAX_BYTE):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=gen)
    if model_like:  # K after an RMSNorm: unit rows with a few outlier channels; V of order 1
        k = torch.randn(B, Hkv, L, D, generator=gen)
        k = k / k.pow(2).mean(-1, keepdim=True).sqrt()
        k[..., :2] *= 6
        v = torch.randn(B, Hkv, L, D, generator=gen) * 0.5
    else:
        k, v = torch.randn(B, Hkv, L, D, generator=gen) * 3, torch.randn(B, Hkv, L, D, generator=gen)
    ks, vs = float(k.abs().max()) / FP8_MAX, float(v.abs().max()) / FP8_MAX
    kc, vc = kv_quantize(k, ks), kv_quantize(v, vs)
    past = torch.randint(0, L - S + 1, (B,), generator=gen)
    past[0] = L - S  # one row reads the whole cache
    pos = past[:, None] + torch.arange(S)
    mask = (torch.arange(L)[None, None, :] <= pos[:, :, None])[:, None]  # [B, 1, S, L]
    # slots no query reads hold `poison` (448, which would dominate any softmax row that read it;
    # the GPU kernels' tests use NaN, which they never load): they must not reach the output
    unread = ~mask.any(2, keepdim=True).expand(B, 1, 1, L)[:, 0, 0]  # [B, L]
    nan = torch.full((), poison, dtype=torch.uint8)
    kc.view(torch.uint8)[unread[:, None, :].expand(B, Hkv, L)] = nan
    vc.view(torch.uint8)[unread[:, None, :].expand(B, Hkv, L)] = nan
    return q, kc, vc, mask, ks, vs


@pytest.mark.parametrize("model_like", [False, True], ids=["random", "model-like"])
@pytest.mark.parametrize("dtype", list(TOL), ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("B,H,Hkv,S,L,D", SHAPES)
def test_attention_fp8_against_fp64_oracle(B, H, Hkv, S, L, D, dtype, model_like):
    q, kc, vc, mask, ks, vs = _inputs(B, H, Hkv, S, L, D, seed=S * 7 + L, model_like=model_like)
    q = q.to(dtype)
    o = attention_fp8(q, kc, vc, mask, D ** -0.5, ks, vs)
    assert o.dtype == dtype and o.shape == q.shape and torch.isfinite(o).all()
    want = oracle_attention(q, kc, vc, mask, D ** -0.5, ks, vs)
    err = float((o.double() - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt())
    assert err <= TOL[dtype], err
