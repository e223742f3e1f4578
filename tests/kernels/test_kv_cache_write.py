"""The one-launch K/V cache write (gdn_export.ops.attention.triton.kv_cache_write) against an independent loop.

Fresh random caches (every slot the write must leave alone keeps its random value, so a stray write
shows), ragged write positions (first slot, last slots, rows at different offsets), S = 1 (decode)
and S > 1 (prefill chunks), odd head sizes, strided views as the model hands them (k / v are
transposes of [B, S, Hkv, D] projections), the update in another dtype than the caches (rounded on
store), and int32 / int64 indices. A write is a copy, so the result must equal the loop's exactly.
Runs under TRITON_INTERPRET=1 on CPU (conftest.py); on a GPU also through the public op.
"""

import pytest
import torch

from gdn_export.ops.attention.triton.kv_cache_write import kv_cache_write_, supports
from gdn_export.ops.attention import write_kv_cache_

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CASES = {  # id: (B, Hkv, L, S, D, write positions)
    "decode-B1-D256": (1, 2, 40, 1, 256, [39]),
    "decode-B5-D96-ragged": (5, 3, 33, 1, 96, [0, 32, 7, 16, 31]),
    "prefill-B3-S7-D80": (3, 2, 29, 7, 80, [0, 22, 9]),
    "prefill-B2-S33-D128-full": (2, 1, 33, 33, 128, [0, 0]),
    "chunk-B4-S5-D24-Hkv5": (4, 5, 18, 5, 24, [13, 3, 0, 8]),
}


def loop_reference(kc, vc, k, v, idx):
    kc, vc = kc.clone(), vc.clone()
    for b, start in enumerate(idx):
        for s in range(k.shape[2]):
            kc[b, :, start + s] = k[b, :, s].to(kc.dtype)
            vc[b, :, start + s] = v[b, :, s].to(vc.dtype)
    return kc, vc


def make(B, Hkv, L, S, D, cache_dtype, new_dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    kc = torch.randn(B, Hkv, L, D, generator=gen).to(cache_dtype)
    vc = torch.randn(B, Hkv, L, D, generator=gen).to(cache_dtype)
    # [B, S, Hkv, D] projections seen as [B, Hkv, S, D]: the strides the attention layer passes
    k = torch.randn(B, S, Hkv, D, generator=gen).to(new_dtype).transpose(1, 2)
    v = torch.randn(B, S, Hkv, D, generator=gen).to(new_dtype).transpose(1, 2)
    return kc, vc, k, v


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
                                    (torch.float32, torch.float32)], ids=["bf16", "fp32-into-fp16", "fp32"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_write_equals_loop(case, dtypes, index_dtype):
    B, Hkv, L, S, D, starts = case
    cache_dtype, new_dtype = dtypes
    kc, vc, k, v = make(B, Hkv, L, S, D, cache_dtype, new_dtype, seed=B * 100 + S * 10 + D)
    want_k, want_v = loop_reference(kc, vc, k, v, starts)
    kc, vc, k, v = (t.to(DEVICE) for t in (kc, vc, k, v))
    idx = torch.tensor(starts, dtype=index_dtype, device=DEVICE)
    assert supports(kc, vc, k, v, idx)
    kv_cache_write_(kc, vc, k, v, idx)
    assert torch.equal(kc.cpu(), want_k)
    assert torch.equal(vc.cpu(), want_v)


def test_strided_cache_view():
    """Caches that are views of a larger buffer (every other slot): only the view's slots change."""
    base_k = torch.randn(2, 2, 24, 16).to(DEVICE)
    base_v = torch.randn(2, 2, 24, 16).to(DEVICE)
    keep_k, keep_v = base_k.clone(), base_v.clone()
    kc, vc = base_k[:, :, ::2], base_v[:, :, ::2]  # [2, 2, 12, 16], slot stride 32
    k, v = torch.randn(2, 2, 3, 16).to(DEVICE), torch.randn(2, 2, 3, 16).to(DEVICE)
    idx = torch.tensor([0, 9], device=DEVICE)
    want_k, want_v = loop_reference(kc.cpu(), vc.cpu(), k.cpu(), v.cpu(), [0, 9])
    kv_cache_write_(kc, vc, k, v, idx)
    assert torch.equal(kc.cpu(), want_k) and torch.equal(vc.cpu(), want_v)
    assert torch.equal(base_k[:, :, 1::2], keep_k[:, :, 1::2]) and torch.equal(base_v[:, :, 1::2], keep_v[:, :, 1::2])


def test_slots_past_the_cache_are_not_written():
    """A row whose slots run past L writes the ones inside and nothing beyond (no out-of-bounds store)."""
    base = torch.randn(2, 1, 2 * 10, 8).to(DEVICE)  # two caches back to back: the second must not change
    kc, vc = base[:, :, :10], torch.zeros(2, 1, 10, 8, device=DEVICE)
    after = base[:, :, 10:].clone()
    k = torch.randn(2, 1, 4, 8, device=DEVICE)
    kv_cache_write_(kc, vc, k, k, torch.tensor([8, 0], device=DEVICE))
    assert torch.equal(kc[0, :, 8:], k[0, :, :2]) and torch.equal(kc[1, :, :4], k[1])
    assert torch.equal(base[:, :, 10:], after)


@pytest.mark.parametrize("bad", ["rank", "heads", "index-shape", "index-dtype"])
def test_supports_refuses(bad):
    kc, vc, k, v = make(2, 2, 8, 1, 16, torch.float32, torch.float32, seed=1)
    idx = torch.tensor([0, 1])
    if bad == "rank":
        k, v = k[0], v[0]
    elif bad == "heads":
        k, v = k[:, :1], v[:, :1]
    elif bad == "index-shape":
        idx = idx[:1]
    else:
        idx = idx.float()
    assert not supports(kc, vc, k, v, idx)


@pytest.mark.skipif(DEVICE == "cpu", reason="the public op's GPU route (CPU: scatter_, tested in tests/ops)")
def test_public_op_takes_the_kernel_and_matches(monkeypatch):
    from gdn_export.ops.attention.triton import kv_cache_write
    calls = []
    original = kv_cache_write.kv_cache_write_
    monkeypatch.setattr(kv_cache_write, "kv_cache_write_", lambda *a: calls.append(1) or original(*a))
    kc, vc, k, v = make(3, 2, 50, 4, 256, torch.bfloat16, torch.bfloat16, seed=7)
    want_k, want_v = loop_reference(kc, vc, k, v, [46, 0, 20])
    kc, vc, k, v = (t.cuda() for t in (kc, vc, k, v))
    write_kv_cache_(kc, vc, k, v, torch.tensor([46, 0, 20], device="cuda"))
    torch.ops.gdn.write_kv_cache_(kc, vc, k, v, torch.tensor([46, 0, 20], device="cuda"))
    assert calls == [1, 1]
    assert torch.equal(kc.cpu(), want_k) and torch.equal(vc.cpu(), want_v)
