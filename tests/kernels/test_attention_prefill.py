"""Flash-attention prefill (gdn_export.ops.attention.triton.prefill) against a float64 masked softmax.

Fresh random inputs and the masks a prefill makes: causal over each row's own past (ragged), past
0, a short context in a long cache, a streaming window, holes (evicted or unwritten slots inside the
visible range), rows padded with queries that read nothing (zeros). Cache slots that no query of a
row may read hold NaN (key) and inf (value), as an unwritten cache might: the kernel must not read
them. Small blocks (16 x 16) make many query blocks and tiles at CPU sizes, so the per-block kv
ranges and the skipping are exercised; a few cases take the default blocks. Runs under
TRITON_INTERPRET=1 on CPU (conftest.py); on a GPU also at D = 128 / 256 and through the public op
at the 1.66B model's prefill shape.
"""

import pytest
import torch

from tests.conftest import rel_rms
from tests.kernels.test_attention_decode import reference

import gdn_export.ops.attention as attention_module
from gdn_export.ops.attention.triton import decode as decode_module
from gdn_export.ops.attention.triton import prefill as prefill_module
from gdn_export.ops.attention.triton.prefill import attention_prefill, config, kv_ranges, supports

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# relative RMS against float64: P is rounded to the 16-bit dtype before P V (as flash attention
# does), then the output: bf16 (8-bit mantissa) measured 2-3e-3, fp16 (11 bits) 3e-4
TOL = {torch.bfloat16: 1e-2, torch.float16: 3e-3}
NAME = {torch.bfloat16: "bf16", torch.float16: "fp16"}
BF16, FP16 = torch.bfloat16, torch.float16
WINDOW = 20  # slots a query of the "window" masks sees, its own included


def make_mask(kind, B, S, L, gen):
    """[B, 1, S, L] bool. Row b's queries sit at slots past_b .. past_b + S - 1 and read causally:
    past random per row (ragged) unless kind is "past0"; "window" keeps the last WINDOW slots,
    "holes" drops ~30% of the slots for all queries of a row (slot 0, a sink, kept), "padded" gives
    row b only n_b real queries: the rest read nothing."""
    past = torch.zeros(B, dtype=torch.int64) if kind == "past0" else torch.randint(0, L - S + 1, (B,), generator=gen)
    pos = past[:, None] + torch.arange(S)  # [B, S]
    slot = torch.arange(L)
    mask = slot[None, None, :] <= pos[:, :, None]
    if kind == "window":
        mask &= slot[None, None, :] > pos[:, :, None] - WINDOW
    elif kind == "holes":
        holes = torch.rand(B, 1, L, generator=gen) < 0.3
        holes[..., 0] = False
        mask &= ~holes
    elif kind == "padded":
        n = torch.randint(0, S + 1, (B,), generator=gen)
        n[0] = S
        mask &= (torch.arange(S)[None, :] < n[:, None])[:, :, None]
    return mask[:, None]


def make_inputs(B, H, Hkv, S, L, D, dtype, mask, seed, poison=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=gen) * 1.5  # scores of std 1.5: peaked and flat rows
    key = torch.randn(B, Hkv, L, D, generator=gen)
    value = torch.randn(B, Hkv, L, D, generator=gen)
    x = [t.to(dtype) for t in (q, key, value)]
    want = reference(*x, mask, D ** -0.5)
    if poison:  # slots no query of the row may read: NaN keys, inf values
        unread = ~mask.expand(B, 1, S, L).any(2)[:, :, :, None].expand(B, Hkv, L, D)
        x[1] = x[1].masked_fill(unread, float("nan"))
        x[2] = x[2].masked_fill(unread, float("inf"))
    return [t.to(DEVICE) for t in x] + [mask.to(DEVICE)], want


def check(o, want, mask, dtype):
    assert torch.isfinite(o).all()
    err = rel_rms(o, want)
    assert err <= TOL[dtype], f"relative RMS {err:.3g} > {TOL[dtype]:g}"
    B, H, S, _ = o.shape
    empty = ~mask.cpu().expand(B, 1, S, -1).any(-1)  # [B, 1, S]: rows that may read nothing
    assert (o[empty.expand(B, H, S)] == 0).all()


def _case(kind, B, G, Hkv, S, L, D, dtype, block=(16, 16), gpu=False):
    blk = "default" if block is None else f"{block[0]}x{block[1]}"
    return pytest.param(kind, B, G, Hkv, S, L, D, dtype, block,
                        id=f"{kind}-B{B}-G{G}-Hkv{Hkv}-S{S}-L{L}-D{D}-{NAME[dtype]}-{blk}",
                        marks=[pytest.mark.gpu] if gpu else [])


CASES = [
    _case("causal", 3, 2, 2, 17, 63, 32, BF16), _case("causal", 2, 3, 1, 63, 100, 16, FP16),
    _case("causal", 2, 1, 2, 100, 100, 64, BF16, block=None), _case("causal", 1, 8, 1, 33, 40, 64, FP16, block=(32, 16)),
    _case("past0", 2, 2, 2, 63, 63, 32, FP16), _case("past0", 1, 1, 3, 100, 100, 16, BF16, block=(16, 32)),
    _case("short-in-long", 2, 2, 1, 17, 300, 32, BF16), _case("short-in-long", 1, 8, 2, 1, 300, 64, FP16),
    _case("window", 2, 2, 2, 63, 100, 32, BF16), _case("window", 1, 3, 1, 100, 100, 24, FP16, block=(32, 16)),
    _case("holes", 2, 8, 1, 17, 63, 16, FP16), _case("holes", 2, 1, 2, 63, 100, 40, BF16),
    _case("padded", 3, 2, 1, 33, 63, 32, BF16), _case("padded", 2, 3, 2, 17, 17, 64, FP16, block=None),
]
if torch.cuda.is_available():
    CASES += [_case(kind, 2, G, 2, S, L, D, dt, block=None, gpu=True)
              for kind, S, L in (("causal", 700, 1100), ("window", 300, 1024), ("short-in-long", 129, 4128))
              for G, D in ((8, 256), (1, 128)) for dt in (BF16, FP16)]


@pytest.mark.parametrize("kind, B, G, Hkv, S, L, D, dtype, block", CASES)
def test_matches_float64_reference(kind, B, G, Hkv, S, L, D, dtype, block):
    seed = B * 1000 + G * 100 + S + L + D
    mask = make_mask(kind, B, S, L, torch.Generator().manual_seed(seed))
    x, want = make_inputs(B, G * Hkv, Hkv, S, L, D, dtype, mask, seed)
    o = attention_prefill(*x, D ** -0.5, block=block)
    assert o.shape == x[0].shape and o.dtype == dtype
    check(o.cpu(), want, mask, dtype)


@pytest.mark.parametrize("layout", ["mask-1-1-S-L", "mask-B-1-1-L", "mask-1-1-1-L", "all-false-row"])
def test_broadcast_and_empty_masks(layout):
    """A mask that arrives broadcast (stride 0, not copied) and one whose batch row, or one query,
    may read nothing (zeros)."""
    B, G, Hkv, S, L, D = 3, 2, 2, 33, 70, 32
    gen = torch.Generator().manual_seed(11)
    if layout == "mask-1-1-S-L":
        mask = make_mask("causal", 1, S, L, gen)
    elif layout == "mask-B-1-1-L":
        mask = make_mask("holes", B, 1, L, gen)
    elif layout == "mask-1-1-1-L":
        mask = make_mask("window", 1, 1, L, gen)
    else:
        mask = make_mask("causal", B, S, L, gen)
        mask[0] = False
        mask[1, 0, 5] = False
    x, want = make_inputs(B, G * Hkv, Hkv, S, L, D, FP16, mask, 11)
    check(attention_prefill(*x, D ** -0.5, block=(16, 16)).cpu(), want, mask, FP16)


def test_strided_inputs_and_output():
    """q as the model makes it (a [B, H, S, D] view of [B, S, H, D]), key / value as views of a
    [B, L, Hkv, D] cache: o comes back with empty_like(q)'s strides."""
    B, G, Hkv, S, L, D = 2, 2, 2, 33, 63, 32
    mask = make_mask("causal", B, S, L, torch.Generator().manual_seed(5))
    (q, key, value, mask), want = make_inputs(B, G * Hkv, Hkv, S, L, D, BF16, mask, 5)
    q, key, value = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, key, value))
    o = attention_prefill(q, key, value, mask, D ** -0.5, block=(16, 16))
    assert o.stride() == torch.empty_like(q).stride() == q.stride()
    check(o.cpu(), want, mask, BF16)


def test_kv_ranges_skip_what_no_row_reads():
    """Per query block: the first slot any of its rows may read and one past the last (the kernel
    walks from the tile holding the first); lo = L, hi = 0 for a block that reads nothing."""
    S = L = 64

    def lo_hi(mask, block_m=16):
        ranges, read = kv_ranges(mask.to(DEVICE), L, block_m)
        return [(L - a, b) for a, b in ranges[0].tolist()], read[0].cpu()

    spans, read = lo_hi(make_mask("past0", 1, S, L, None))  # causal over a whole cache
    assert spans == [(0, 16), (0, 32), (0, 48), (0, 64)]
    assert torch.equal(read[1], torch.arange(L) < 32)
    s, slot = torch.arange(S)[:, None], torch.arange(L)
    window = ((slot <= s) & (slot > s - 8))[None, None]  # query s reads slots s - 7 .. s
    window[0, 0, 48:] = False  # the last query block reads nothing
    assert lo_hi(window)[0] == [(0, 16), (9, 32), (25, 48), (64, 0)]
    # a ragged last block (S = 40: rows 32..39); a mask broadcast over S: one block for all
    assert lo_hi(make_mask("past0", 1, 40, L, None))[0] == [(0, 16), (0, 32), (0, 40)]
    spans, read = lo_hi(torch.ones(1, 1, 1, L, dtype=torch.bool))
    assert spans == [(0, L)] and read.shape == (1, L) and read.all()


def test_config_and_supports():
    def t(*shape, dtype=BF16):
        return torch.empty(*shape, dtype=dtype)

    assert config(256, True) == (64, 32, 4, 2) and config(256, False) == (64, 32, 8, 2)
    assert config(96, False) == config(128, True) == (64, 32, 4, 3) and config(8, True) == config(64, False)
    mask = torch.ones(1, 1, 1, 300, dtype=torch.bool)
    assert supports(t(2, 16, 100, 256), t(2, 2, 300, 256), t(2, 2, 300, 256), mask)
    assert supports(t(2, 6, 100, 96), t(2, 2, 300, 96), t(2, 2, 300, 96), mask.expand(2, 1, 100, 300))
    assert not supports(t(2, 16, 100, 512), t(2, 2, 300, 512), t(2, 2, 300, 512), mask)  # D > 256
    assert not supports(t(2, 16, 100, 64, dtype=torch.float32), t(2, 2, 300, 64, dtype=torch.float32),
                        t(2, 2, 300, 64, dtype=torch.float32), mask)
    assert not supports(t(2, 16, 100, 64), t(2, 2, 300, 64), t(2, 2, 300, 64), mask.float())
    assert not supports(t(2, 16, 100, 64), t(2, 3, 300, 64), t(2, 3, 300, 64), mask)  # H % Hkv
    assert not supports(t(2, 16, 100, 64), t(2, 2, 300, 64), t(2, 2, 300, 64), mask[..., :200])
    # int32 offsets inside a (batch, head) slice: a cache laid out [L, ..., D] with 2^23 values per slot
    huge = torch.empty_strided((2, 2, 300, 64), (64, 128, 2**23, 1), dtype=BF16, device="meta")
    assert not supports(t(2, 16, 100, 64), huge, huge, mask)
    assert supports(t(2, 16, 100, 64), huge[:, :, :256], huge[:, :, :256], mask[..., :256])
    with pytest.raises(ValueError, match="unsupported"):
        attention_prefill(t(2, 16, 100, 512), t(2, 2, 300, 512), t(2, 2, 300, 512), mask, 1.0)


@pytest.mark.parametrize("S, L, dtype, route", [(1, 300, BF16, "decode"), (3, 4128, FP16, "decode"),
                                                (100, 300, BF16, "prefill"), (1, 100, FP16, "prefill"),
                                                (100, 300, torch.float32, "sdpa")],
                         ids=["decode-step", "decode-3-rows", "prefill", "decode-short-cache", "fp32"])
def test_op_dispatch(monkeypatch, S, L, dtype, route):
    """_attention_cuda (the op's half-precision GPU path) picks the decode kernel for a few query
    rows against a long cache, the prefill kernel for the rest it supports, else SDPA (G = 8,
    D = 256: the 1.66B model's heads). Shapes only: the entry points are replaced by recorders."""
    calls = []
    for name, module, fn in (("decode", decode_module, "attention_decode"),
                             ("prefill", prefill_module, "attention_prefill"),
                             ("sdpa", attention_module, "_attention_sdpa")):
        monkeypatch.setattr(module, fn, lambda q, *a, name=name: calls.append(name) or q)
    q, key = torch.empty(1, 16, S, 256, dtype=dtype), torch.empty(1, 2, L, 256, dtype=dtype)
    attention_module._attention_cuda(q, key, key, torch.ones(1, 1, S, L, dtype=torch.bool), 0.0625)
    assert calls == [route]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none found)")
@pytest.mark.parametrize("B, S, past", [(1, 4096, [0]), (2, 2048, [2080, 0])], ids=["B1-S4096", "B2-S2048-ragged"])
def test_public_op_matches_fp32_path(B, S, past):
    """gdn::attention in bf16 at the 1.66B model's prefill (H 16, Hkv 2, D 256, L 4128, causal)
    takes the prefill kernel, agrees with the op's fp32 SDPA path, replays from a CUDA graph and
    stays opaque to torch.compile."""
    from gdn_export.ops.attention import _triton_kernel, attention

    H, Hkv, L, D = 16, 2, 4128, 256
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, key, value = (torch.randn(B, h, n, D, device="cuda", generator=gen).to(BF16)
                     for h, n in ((H, S), (Hkv, L), (Hkv, L)))
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # the model's layout
    pos = torch.tensor(past, device="cuda")[:, None] + torch.arange(S, device="cuda")
    mask = (torch.arange(L, device="cuda")[None, None, :] <= pos[:, :, None])[:, None]
    scale = D ** -0.5
    got = attention(q, key, value, mask, scale)
    assert torch.equal(got, _triton_kernel("attention_prefill").attention_prefill(q, key, value, mask, scale))  # the kernel ran
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), key.float(), value.float(), attn_mask=mask, scale=scale, enable_gqa=True)
    assert rel_rms(got.float(), want) <= TOL[BF16]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = attention(q, key, value, mask, scale)
    q.copy_(torch.randn_like(q))
    graph.replay()
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), key.float(), value.float(), attn_mask=mask, scale=scale, enable_gqa=True)
    assert rel_rms(replayed.float(), want) <= TOL[BF16]
    fn = torch.compile(lambda *x: attention(*x, scale), fullgraph=True)
    assert torch.equal(fn(q, key, value, mask), attention(q, key, value, mask, scale))
