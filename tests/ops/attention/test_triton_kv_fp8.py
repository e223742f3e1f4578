"""The Triton attention kernels over an FP8 K/V cache (kernels.attention.triton.decode /
prefill with k_scale / v_scale) and the scaling cache write (kv_cache_write with scales).

decode / prefill: the fp8 cache with its scales must give what the same kernel gives on the 16-bit
cache kv_dequantize makes (the tiles are the same values): bitwise under the interpreter and for the
prefill kernel, within 1e-3 for the decode kernel compiled (fp16 differed in the last bits on the
H200); and be within the dtype's bound of an fp64 oracle over the dequantized cache. Slots no query reads hold NaN codes
(0x7F) and the decode output buffer is NaN-filled beforehand; ragged rows (different past lengths
per row, one row at the cache's end), odd S / L, D not a power of two (prefill), Hq = 4 Hkv.
Runs under TRITON_INTERPRET=1 on the CPU (conftest.py) and on the GPU (marked gpu there).

The write: exactly quantize_ref (e4m3 of clamp(x / scale, +-448), round to nearest even), on the
GPU only: Triton's interpreter converts fp32 -> e4m3 with its own rounding (ties away from zero, and
values just under a power of two rounded down an octave: 124.9 -> 64), not the hardware's.
"""

from __future__ import annotations

import pytest
import torch

from gdn_export.ops.attention.kv_fp8 import FP8_MAX, attention_fp8, dequantize_ref, quantize_ref
from kernels.attention.triton.decode import attention_decode
from kernels.attention.triton.kv_cache_write import kv_cache_write_
from kernels.attention.triton.prefill import attention_prefill

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAN_BYTE = 0x7F
BOUND = {torch.float16: 5e-3, torch.bfloat16: 2e-2}  # relative RMS vs the fp64 oracle
DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]
DECODE = {  # id: (B, H, Hkv, S, L, D)
    "B1-G2-D16": (1, 2, 1, 1, 300, 16),
    "B3-G4-D64-ragged": (3, 8, 2, 1, 257, 64),
    "B2-S2-D32": (2, 4, 2, 2, 130, 32),
}
PREFILL = {
    "S63-D24": (2, 4, 2, 63, 80, 24),
    "S65-L130-G4": (2, 8, 2, 65, 130, 32),
    "S1-D16": (3, 2, 1, 1, 40, 16),
}


def make(B, H, Hkv, S, L, D, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=gen).to(dtype)
    k = torch.randn(B, Hkv, L, D, generator=gen)
    k = k / k.pow(2).mean(-1, keepdim=True).sqrt()  # normed K with outlier channels, as after k_norm
    k[..., :2] *= 5
    v = torch.randn(B, Hkv, L, D, generator=gen) * 0.7
    ks, vs = float(k.abs().max()) / FP8_MAX, float(v.abs().max()) / FP8_MAX
    kc, vc = quantize_ref(k, ks), quantize_ref(v, vs)
    past = torch.randint(0, L - S + 1, (B,), generator=gen)
    past[0] = L - S
    pos = past[:, None] + torch.arange(S)
    mask = (torch.arange(L)[None, None, :] <= pos[:, :, None])[:, None]  # [B, 1, S, L]
    unread = ~mask[:, 0].any(1)  # [B, L]
    for c in (kc, vc):
        c.view(torch.uint8)[unread[:, None, :].expand(B, Hkv, L)] = NAN_BYTE
    return [t.to(DEVICE) for t in (q, kc, vc, mask)] + [ks, vs]


def oracle(q, kc, vc, mask, scale, ks, vs):
    B, H, S, D = q.shape
    G = H // kc.shape[1]
    K = torch.nan_to_num(kc.cpu().double() * ks).repeat_interleave(G, 1)
    V = torch.nan_to_num(vc.cpu().double() * vs).repeat_interleave(G, 1)
    s = torch.einsum("bhsd,bhld->bhsl", q.cpu().double(), K) * scale
    p = torch.softmax(s.masked_fill(~mask.cpu(), float("-inf")), -1)
    return torch.einsum("bhsl,bhld->bhsd", p, V)


def rel(a, b):
    a = a.cpu().double()
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", DECODE.values(), ids=DECODE.keys())
def test_decode_fp8_cache(case, dtype):
    q, kc, vc, mask, ks, vs = make(*case, dtype, seed=sum(case))
    D = q.shape[-1]
    out = torch.full_like(q, float("nan"))
    got = attention_decode(q, kc, vc, mask, D ** -0.5, out=out, k_scale=ks, v_scale=vs)
    assert got.data_ptr() == out.data_ptr() and torch.isfinite(got).all()
    same = attention_decode(q, dequantize_ref(torch.nan_to_num(kc.float()).to(kc.dtype), ks, dtype),
                            dequantize_ref(torch.nan_to_num(vc.float()).to(vc.dtype), vs, dtype), mask, D ** -0.5)
    if DEVICE == "cpu":
        assert torch.equal(got, same)
    else:  # compiled: fp16 differed from the 16-bit cache's result in the last bits on the H200
        assert rel(got, same.cpu().double()) <= 1e-3
    assert rel(got, oracle(q, kc, vc, mask, D ** -0.5, ks, vs)) <= BOUND[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", PREFILL.values(), ids=PREFILL.keys())
def test_prefill_fp8_cache(case, dtype):
    q, kc, vc, mask, ks, vs = make(*case, dtype, seed=sum(case))
    D = q.shape[-1]
    got = attention_prefill(q, kc, vc, mask, D ** -0.5, k_scale=ks, v_scale=vs)
    assert torch.isfinite(got).all()
    same = attention_prefill(q, dequantize_ref(torch.nan_to_num(kc.float()).to(kc.dtype), ks, dtype),
                             dequantize_ref(torch.nan_to_num(vc.float()).to(vc.dtype), vs, dtype), mask, D ** -0.5)
    assert torch.equal(got, same)
    assert rel(got, oracle(q, kc, vc, mask, D ** -0.5, ks, vs)) <= BOUND[dtype]


# the positional prefill (gdn::attention_fp8_at's kernel): (B, H, Hkv, S, L, D, sinks, window)
POSITIONS = {
    "S63-D24-causal": (2, 4, 2, 63, 80, 24, 0, 0),
    "S65-L130-G4-causal": (2, 8, 2, 65, 130, 32, 0, 0),
    "S7-D32-sinks3-window20": (2, 4, 2, 7, 23, 32, 3, 20),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", POSITIONS.values(), ids=POSITIONS.keys())
def test_prefill_positions_fp8_cache(case, dtype):
    """The positional kernel on the fp8 cache gives what it gives on the dequantized 16-bit cache
    (bitwise), within the bound of the fp64 oracle under visibility's mask; slots no query reads hold
    NaN codes; and gdn::attention_fp8_at (on a CPU: the mask built, attention_fp8's body) agrees."""
    from gdn_export.ops.attention.kv_fp8 import attention_fp8_at
    from gdn_export.ops.attention.positions import slot_of, visibility
    from kernels.attention.triton.prefill_positions import attention_prefill_positions

    B, H, Hkv, S, L, D, sinks, window = case
    q, kc, vc, _, ks, vs = make(B, H, Hkv, S, L, D, dtype, seed=sum(case))
    past = torch.tensor([L - S, 0] if not window else [0, 50])
    assert (slot_of(past, sinks, window) + S <= L).all()
    mask = visibility(past, S, L, sinks, window)
    unread = ~mask[:, 0].any(1)
    kc, vc = kc.cpu().clone(), vc.cpu().clone()
    for c in (kc, vc):  # make() poisoned under its own causal mask: this case's mask instead
        codes = c.view(torch.uint8)
        codes.masked_fill_(codes == NAN_BYTE, 0)
        codes[unread[:, None, :].expand(B, Hkv, L)] = NAN_BYTE
    q, kc, vc, past, mask = (t.to(DEVICE) for t in (q, kc, vc, past, mask))
    got = attention_prefill_positions(q, kc, vc, past, D ** -0.5, sinks, window, k_scale=ks, v_scale=vs)
    assert torch.isfinite(got).all()
    same = attention_prefill_positions(q, dequantize_ref(torch.nan_to_num(kc.float()).to(kc.dtype), ks, dtype),
                                       dequantize_ref(torch.nan_to_num(vc.float()).to(vc.dtype), vs, dtype), past,
                                       D ** -0.5, sinks, window)
    assert torch.equal(got, same)
    assert rel(got, oracle(q, kc, vc, mask, D ** -0.5, ks, vs)) <= BOUND[dtype]
    # the op's CPU path dequantizes the whole cache (its contract: no NaN codes): the clean cache
    clean = [c.view(torch.uint8).masked_fill(c.view(torch.uint8) == NAN_BYTE, 0).view(c.dtype) for c in (kc, vc)]
    op = attention_fp8_at(q, *clean, past, D ** -0.5, sinks, window, ks, vs)
    assert rel(op, oracle(q, kc, vc, mask, D ** -0.5, ks, vs)) <= BOUND[dtype]


def test_scales_and_cache_dtype_must_agree():
    q, kc, vc, mask, ks, vs = make(1, 2, 1, 1, 300, 16, torch.bfloat16, seed=0)
    with pytest.raises(ValueError, match="take both scales"):
        attention_decode(q, kc, vc, mask, 0.25)
    with pytest.raises(ValueError, match="take both scales"):
        attention_prefill(q, kc.float().to(q.dtype), vc.float().to(q.dtype), mask, 0.25, k_scale=ks, v_scale=vs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="e4m3 rounding of the interpreter differs (docstring)")
@pytest.mark.parametrize("new_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("S,D", [(1, 256), (63, 24), (65, 128)], ids=["S1-D256", "S63-D24", "S65-D128"])
def test_write_scales_clamps_casts(S, D, new_dtype):
    gen = torch.Generator().manual_seed(S + D)
    B, Hkv, L = 3, 2, 140
    kc = torch.full((B, Hkv, L, D), NAN_BYTE, dtype=torch.uint8).view(torch.float8_e4m3fn)
    vc = kc.clone()
    # [B, S, Hkv, D] projections seen as [B, Hkv, S, D]; a few values far past 448 * scale
    k = (torch.randn(B, S, Hkv, D, generator=gen) * 2).to(new_dtype).transpose(1, 2)
    v = (torch.randn(B, S, Hkv, D, generator=gen) * 0.5).to(new_dtype).transpose(1, 2)
    k[0, 0, 0, :2] = torch.tensor([1e4, -1e4]).to(new_dtype)
    idx = torch.tensor([0, 17, L - S])
    kc, vc, k, v, idx = (t.to(DEVICE) for t in (kc, vc, k, v, idx))
    kv_cache_write_(kc, vc, k, v, idx, k_scale=0.0123, v_scale=0.00311)
    for b in range(B):
        lo = int(idx[b])
        assert torch.equal(kc[b, :, lo:lo + S].view(torch.uint8), quantize_ref(k[b], 0.0123).view(torch.uint8))
        assert torch.equal(vc[b, :, lo:lo + S].view(torch.uint8), quantize_ref(v[b], 0.00311).view(torch.uint8))
        for c in (kc, vc):
            rest = torch.cat([c[b, :, :lo], c[b, :, lo + S:]], 1).view(torch.uint8)
            assert (rest == NAN_BYTE).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the op's GPU route")
@pytest.mark.parametrize("case", [(2, 16, 2, 1, 4099, 256), (2, 8, 2, 65, 130, 128)], ids=["decode-L4099", "prefill"])
def test_op_routes_to_the_kernels(case):
    q, kc, vc, mask, ks, vs = make(*case, torch.bfloat16, seed=1)
    D = q.shape[-1]
    got = attention_fp8(q, kc, vc, mask, D ** -0.5, ks, vs)
    kernel = attention_decode if case[3] == 1 else attention_prefill
    assert torch.equal(got, kernel(q, kc, vc, mask, D ** -0.5, k_scale=ks, v_scale=vs))
    assert rel(got, oracle(q, kc, vc, mask, D ** -0.5, ks, vs)) <= BOUND[torch.bfloat16]
