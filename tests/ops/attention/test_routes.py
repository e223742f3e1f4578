"""What the attention contract (test_contract.py) cannot see from outputs alone: which path the op
takes for a shape, the kernels' launch plans and input checks, the SDPA route's head order, the
in-place write staying in place under torch.compile, and the public op on a GPU (the kernel ran,
CUDA-graph replay, torch.compile). Inputs and the float64 oracle are the contract's (cases.py)."""

import pytest
import torch

import gdn_export.ops.attention as attention_module
from kernels.attention.triton import decode as decode_module
from kernels.attention.triton import prefill as prefill_module
from tests.conftest import rel_rms
from tests.ops.attention.cases import BOUND, Case, make_inputs, make_mask, oracle
from tests.ops.impl import HAS_CUDA, NO_GPU

BF16, FP16 = torch.bfloat16, torch.float16
DEVICE = "cuda" if HAS_CUDA else "cpu"


def _t(*shape, dtype=BF16):
    return torch.empty(*shape, dtype=dtype)


# ---------------------------------------------------------------------------------- op dispatch


@pytest.mark.parametrize("S, L, dtype, route", [(1, 300, BF16, "decode"), (3, 4128, FP16, "decode"),
                                                (100, 300, BF16, "prefill"), (1, 100, FP16, "prefill"),
                                                (100, 300, torch.float32, "sdpa"), (1, 300, BF16, "sdpa-D512")],
                         ids=["decode-step", "decode-3-rows", "prefill", "decode-short-cache", "fp32",
                              "D512-neither-kernel"])
def test_op_dispatch(monkeypatch, S, L, dtype, route):
    """_attention_cuda (the op's half-precision GPU path) picks the decode kernel for a few query
    rows against a long cache, the prefill kernel for the rest it supports, else SDPA (G = 8,
    D = 256: the 1.66B model's heads). Shapes only: the entry points are replaced by recorders."""
    calls = []
    for name, module, fn in (("decode", decode_module, "attention_decode"),
                             ("prefill", prefill_module, "attention_prefill"),
                             ("sdpa", attention_module, "_attention_sdpa")):
        monkeypatch.setattr(module, fn, lambda q, *a, name=name: calls.append(name) or q)
    D = 512 if route == "sdpa-D512" else 256
    q, key = torch.empty(1, 16, S, D, dtype=dtype), torch.empty(1, 2, L, D, dtype=dtype)
    attention_module._attention_cuda(q, key, key, torch.ones(1, 1, S, L, dtype=torch.bool), 0.0625)
    assert calls == [route.split("-")[0]]


@pytest.mark.parametrize("route", ["one-call", "per-head-calls"])
def test_sdpa_route_reads_each_head_group_in_order(monkeypatch, route):
    """Query head h must read kv head h // G: give each kv head values of its own constant."""
    if route == "per-head-calls":
        monkeypatch.setattr(attention_module, "REPEATED_MASK_MAX", 0)
    B, H, Hkv, S, L, D = 1, 6, 3, 2, 5, 4
    q = torch.randn(B, H, S, D)
    k = torch.randn(B, Hkv, L, D)
    v = torch.arange(Hkv, dtype=torch.float32)[None, :, None, None].expand(B, Hkv, L, D).contiguous()
    o = attention_module._attention_sdpa(q, k, v, torch.ones(B, 1, S, L, dtype=torch.bool), 0.5)
    assert torch.allclose(o[0, :, 0, 0], torch.tensor([0.0, 0, 1, 1, 2, 2]), atol=1e-6)


# --------------------------------------------------------------------- the kernels' plans and checks


def test_decode_split_count_fills_the_gpu():
    # one sequence of the 1.66B model: 64-slot splits (the minimum), 65 x 2 programs
    assert decode_module.split_count(1, 2, 4128, 32, 132) == (65, 64)
    for B, Hkv, L in [(1, 2, 4128), (8, 2, 4128), (32, 4, 32800), (1, 1, 1), (3, 2, 300), (64, 2, 4128)]:
        n, keys = decode_module.split_count(B, Hkv, L, 32, 132)
        assert keys % 32 == 0 and (n - 1) * keys < L <= n * keys  # none empty, all covered
        assert n == 1 or keys >= 64
        # about 4 programs per SM, unless the 64-slot minimum leaves fewer
        assert B * Hkv * n >= min(4 * 132, B * Hkv * -(-L // 64)) // 2


def test_decode_supports():
    supports = decode_module.supports
    mask = torch.ones(1, 1, 1, 300, dtype=torch.bool)
    assert supports(_t(2, 16, 1, 256), _t(2, 2, 300, 256), _t(2, 2, 300, 256), mask)
    assert supports(_t(2, 16, 2, 256), _t(2, 2, 300, 256), _t(2, 2, 300, 256), mask.expand(2, 1, 2, 300))
    assert decode_module.max_rows(256) == 32 and decode_module.max_rows(128) == 64
    assert not supports(_t(2, 16, 5, 256), _t(2, 2, 300, 256), _t(2, 2, 300, 256), mask)  # 40 rows
    assert not supports(_t(2, 16, 1, 96), _t(2, 2, 300, 96), _t(2, 2, 300, 96), mask)  # D not 2^k
    assert not supports(_t(2, 16, 1, 80), _t(2, 2, 300, 80), _t(2, 2, 300, 80), mask)
    f32 = torch.float32
    assert not supports(_t(2, 16, 1, 64, dtype=f32), _t(2, 2, 300, 64, dtype=f32), _t(2, 2, 300, 64, dtype=f32), mask)
    assert not supports(_t(2, 16, 1, 64), _t(2, 2, 300, 64), _t(2, 2, 300, 64), mask.float())
    assert not supports(_t(2, 16, 1, 64), _t(2, 3, 300, 64), _t(2, 3, 300, 64), mask)  # H % Hkv
    with pytest.raises(ValueError, match="unsupported"):
        decode_module.attention_decode(_t(2, 16, 1, 96), _t(2, 2, 300, 96), _t(2, 2, 300, 96), mask, 1.0)


def test_prefill_config_and_supports():
    config, supports = prefill_module.config, prefill_module.supports
    assert config(256, True) == (64, 32, 4, 2) and config(256, False) == (64, 32, 8, 2)
    assert config(96, False) == config(128, True) == (64, 32, 4, 3) and config(8, True) == config(64, False)
    mask = torch.ones(1, 1, 1, 300, dtype=torch.bool)
    assert supports(_t(2, 16, 100, 256), _t(2, 2, 300, 256), _t(2, 2, 300, 256), mask)
    assert supports(_t(2, 6, 100, 96), _t(2, 2, 300, 96), _t(2, 2, 300, 96), mask.expand(2, 1, 100, 300))
    assert not supports(_t(2, 16, 100, 512), _t(2, 2, 300, 512), _t(2, 2, 300, 512), mask)  # D > 256
    f32 = torch.float32
    assert not supports(_t(2, 16, 100, 64, dtype=f32), _t(2, 2, 300, 64, dtype=f32), _t(2, 2, 300, 64, dtype=f32),
                        mask)
    assert not supports(_t(2, 16, 100, 64), _t(2, 2, 300, 64), _t(2, 2, 300, 64), mask.float())
    assert not supports(_t(2, 16, 100, 64), _t(2, 3, 300, 64), _t(2, 3, 300, 64), mask)  # H % Hkv
    assert not supports(_t(2, 16, 100, 64), _t(2, 2, 300, 64), _t(2, 2, 300, 64), mask[..., :200])
    # int32 offsets inside a (batch, head) slice: a cache laid out [L, ..., D] with 2^23 values per slot
    huge = torch.empty_strided((2, 2, 300, 64), (64, 128, 2**23, 1), dtype=BF16, device="meta")
    assert not supports(_t(2, 16, 100, 64), huge, huge, mask)
    assert supports(_t(2, 16, 100, 64), huge[:, :, :256], huge[:, :, :256], mask[..., :256])
    with pytest.raises(ValueError, match="unsupported"):
        prefill_module.attention_prefill(_t(2, 16, 100, 512), _t(2, 2, 300, 512), _t(2, 2, 300, 512), mask, 1.0)


def test_prefill_kv_ranges_skip_what_no_row_reads():
    """Per query block: the first slot any of its rows may read and one past the last (the kernel
    walks from the tile holding the first); lo = L, hi = 0 for a block that reads nothing."""
    S = L = 64

    def lo_hi(mask, block_m=16):
        ranges, read = prefill_module.kv_ranges(mask.to(DEVICE), L, block_m)
        return [(L - a, b) for a, b in ranges[0].tolist()], read[0].cpu()

    causal = make_mask(Case("past0", 1, 1, 1, S, L, 16, mask="past0"), torch.Generator())
    spans, read = lo_hi(causal)  # causal over a whole cache
    assert spans == [(0, 16), (0, 32), (0, 48), (0, 64)]
    assert torch.equal(read[1], torch.arange(L) < 32)
    s, slot = torch.arange(S)[:, None], torch.arange(L)
    window = ((slot <= s) & (slot > s - 8))[None, None]  # query s reads slots s - 7 .. s
    window[0, 0, 48:] = False  # the last query block reads nothing
    assert lo_hi(window)[0] == [(0, 16), (9, 32), (25, 48), (64, 0)]
    # a ragged last block (S = 40: rows 32..39); a mask broadcast over S: one block for all
    ragged = make_mask(Case("past0", 1, 1, 1, 40, L, 16, mask="past0"), torch.Generator())
    assert lo_hi(ragged)[0] == [(0, 16), (0, 32), (0, 40)]
    spans, read = lo_hi(torch.ones(1, 1, 1, L, dtype=torch.bool))
    assert spans == [(0, L)] and read.shape == (1, L) and read.all()


@pytest.mark.parametrize("bad", ["rank", "heads", "index-shape", "index-dtype", "devices"])
def test_kv_write_kernel_refuses(bad):
    """kv_cache_write.supports: what the op's fallback (scatter_) takes instead."""
    from kernels.attention.triton.kv_cache_write import supports

    kc, vc = torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)
    k, v = torch.randn(2, 2, 1, 16), torch.randn(2, 2, 1, 16)
    idx = torch.tensor([0, 1])
    assert supports(kc, vc, k, v, idx)
    if bad == "rank":
        k, v = k[0], v[0]
    elif bad == "heads":
        k, v = k[:, :1], v[:, :1]
    elif bad == "index-shape":
        idx = idx[:1]
    elif bad == "index-dtype":
        idx = idx.float()
    else:
        idx = idx.to("meta")
    assert not supports(kc, vc, k, v, idx)


# ------------------------------------------------------------------- the write under torch.compile


@pytest.mark.slow
def test_compiled_write_stays_in_place():
    """Compiled, the caches are written where they lie: the op is called on the graph's inputs and
    no cache-sized buffer is allocated (a compiled scatter_ on the cache was functionalised into a
    copy of the whole cache and a copy back, per cache and per step: 1.5 ms of a 5.2 ms batch-32
    decode step of the 1.66B model at 4096 context on the H200)."""
    from torch._inductor.utils import run_and_get_code

    from gdn_export.ops.attention import write_kv_cache_

    B, Hkv, L, S, D = 2, 2, 64, 1, 16
    kc, vc = torch.randn(B, Hkv, L, D), torch.randn(B, Hkv, L, D)
    k, v = torch.randn(B, Hkv, S, D), torch.randn(B, Hkv, S, D)
    idx = torch.tensor([63, 7])
    want_k, want_v = kc.clone(), vc.clone()
    want_k[0, :, 63], want_k[1, :, 7] = 2 * k[0, :, 0], 2 * k[1, :, 0]
    want_v[0, :, 63], want_v[1, :, 7] = v[0, :, 0], v[1, :, 0]

    def step(kc, vc, k, v, idx):
        write_kv_cache_(kc, vc, k * 2, v, idx)
        return kc.sum() + vc.sum()

    torch._dynamo.reset()
    _, code = run_and_get_code(torch.compile(step, dynamic=False), kc, vc, k, v, idx)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    source = "\n".join(code)
    assert "torch.ops.gdn.write_kv_cache_.default(arg" in source
    allocations = [line for line in source.splitlines() if "empty_strided" in line]
    assert not [line for line in allocations if f"({B}, {Hkv}, {L}, {D})" in line]


# -------------------------------------------------------------------------- the public op on a GPU

OP_SHAPES = {  # id: (Case, the kernel the op must take)
    "decode-B1-G8-D256-L4128": (Case("decode", 1, 8, 2, 1, 4128, 256, mask="decode-lengths"), "decode"),
    "decode-B4-G4-Hkv4-D256-L4128": (Case("decode", 4, 4, 4, 1, 4128, 256, mask="decode-lengths"), "decode"),
    "S2-B3-G8-D256-L4128": (Case("decode", 3, 8, 2, 2, 4128, 256, mask="decode-lengths"), "decode"),
    "prefill-B1-S4096-L4128-D256": (Case("prefill", 1, 8, 2, 4096, 4128, 256, mask="past0", strided=True), "prefill"),
    "prefill-B2-S2048-L4128-D256-ragged": (Case("prefill", 2, 8, 2, 2048, 4128, 256, strided=True), "prefill"),
}


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU)
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", OP_SHAPES.values(), ids=OP_SHAPES.keys())
def test_public_op_takes_the_kernel_replays_and_compiles(shape, dtype):
    """gdn::attention on CUDA at the 1.66B model's shapes takes the named Triton kernel (its result
    bit-equal to the kernel's), agrees with the float64 oracle and with the op's SDPA route, replays
    from a CUDA graph on new queries, and stays one opaque node under torch.compile (fullgraph)."""
    from gdn_export.ops.attention import _attention_sdpa, _triton_kernel, attention

    case, kernel = shape
    x = make_inputs(case, dtype, "cuda")
    args = (x["q"], x["key"], x["value"], x["mask"], x["scale"])
    got = attention(*args)
    module = _triton_kernel(kernel)
    assert module is not None, f"Triton kernel {kernel} unavailable"
    run = module.attention_decode if kernel == "decode" else module.attention_prefill
    assert torch.equal(got, run(*args)), f"the op did not take the {kernel} kernel"
    assert rel_rms(got, oracle(case, x)["o"]) <= BOUND[dtype]
    assert rel_rms(got.float(), _attention_sdpa(*args).float()) <= 2 * BOUND[dtype]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = attention(*args)
    x["q"].copy_(torch.randn_like(x["q"]))
    graph.replay()
    assert rel_rms(replayed, oracle(case, x)["o"]) <= BOUND[dtype]
    # every shape and dtype recompiles the one lambda's code: past dynamo's recompile limit (8) a
    # fullgraph compile fails, so each case starts from a reset
    torch._dynamo.reset()
    fn = torch.compile(lambda *a: attention(*a, x["scale"]), fullgraph=True)
    assert torch.equal(fn(*args[:4]), attention(*args))
