"""Split-KV decode attention (gdn_export.ops.attention.triton.decode) against a float64 masked softmax.

Fresh random inputs, the output NaN-poisoned beforehand, ragged masks (each batch row its own
visible length, 1 and L included; with S > 1 the earlier queries of a length-1 row read nothing and
must come back as zeros), and cache slots that no query may read filled with NaN (the kernel must
not read them). Runs under TRITON_INTERPRET=1 on CPU (conftest.py) at small L; on a GPU also at the
model's L = 4128 and through the public op against its SDPA path.
"""

import pytest
import torch

from tests.conftest import rel_rms

from gdn_export.ops.attention.triton.decode import attention_decode, max_rows, split_count, supports

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# relative RMS against float64: bf16 (8-bit mantissa) rounds p before P V and the output;
# fp16 (11 bits) the same, 8x finer
TOL = {torch.bfloat16: 1e-2, torch.float16: 3e-3}
NAME = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def reference(q, key, value, mask, scale):
    """float64 masked softmax(scale q key^T) value; zeros on rows that may read nothing."""
    B, H, S, D = q.shape
    Hkv, L = key.shape[1], key.shape[2]
    G = H // Hkv
    k = key.double().repeat_interleave(G, 1)
    v = value.double().repeat_interleave(G, 1)
    s = (q.double() @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask.expand(B, 1, S, L), float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ v


def ragged_mask(lengths, S, L):
    """[B, 1, S, L]: row b's last query reads slots < lengths[b], query s the S - 1 - s fewer
    before it (a decode step of S tokens); queries before a row's first slot read nothing."""
    last = torch.tensor(lengths)[:, None] - (S - 1) + torch.arange(S)  # [B, S] slots read
    return (torch.arange(L)[None, None, :] < last[:, :, None])[:, None]


def make_inputs(B, G, Hkv, S, L, D, dtype, lengths, seed, poison=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, G * Hkv, S, D, generator=gen) * 1.5  # scores of std 1.5: peaked and flat rows
    key = torch.randn(B, Hkv, L, D, generator=gen)
    value = torch.randn(B, Hkv, L, D, generator=gen)
    mask = ragged_mask(lengths, S, L)
    x = [t.to(dtype) for t in (q, key, value)]
    want = reference(*x, mask, D ** -0.5)
    if poison:  # slots no query of the row may read hold NaN (as an unwritten cache might)
        unread = ~mask.any(2)[:, :, :, None].expand(B, Hkv, L, D)  # [B, Hkv, L, D]
        x[1] = x[1].masked_fill(unread, float("nan"))
        x[2] = x[2].masked_fill(unread, float("nan"))
    return [t.to(DEVICE) for t in x] + [mask.to(DEVICE)], want


def run(q, key, value, mask, **kw):
    out = torch.full_like(q, float("nan"))
    o = attention_decode(q, key, value, mask, q.shape[-1] ** -0.5, out=out, **kw)
    assert o is out
    return o.cpu()


def check(o, want, mask, dtype):
    assert torch.isfinite(o).all()
    err = rel_rms(o, want)
    assert err <= TOL[dtype], f"relative RMS {err:.3g} > {TOL[dtype]:g}"
    # rows that may read nothing: exactly zero (every head of query s reads mask[b, 0, s])
    B, H, S, _ = o.shape
    empty = ~mask.cpu().expand(B, 1, S, -1).any(-1)  # [B, 1, S]
    assert (o[empty.expand(B, H, S)] == 0).all()


def lengths_for(B, L, seed):
    if B == 1:
        return [L]
    return [1, L, int(torch.randint(1, L + 1, (), generator=torch.Generator().manual_seed(seed)))]


def _case(G, S, D, L, B, dtype, Hkv=2, gpu=False):
    # gpu: a GPU-sized case, marked so that `pytest -m gpu` (benchmarks/gpu_checks.sh) runs it
    return pytest.param(G, S, D, L, B, dtype, Hkv, id=f"G{G}-S{S}-D{D}-L{L}-B{B}-Hkv{Hkv}-{NAME[dtype]}",
                        marks=[pytest.mark.gpu] if gpu else [])


BF16, FP16 = torch.bfloat16, torch.float16
# every (G, S) pair, with D, L, B and dtype rotating; then every D at the model's G = 8, S = 1
CASES = [
    _case(1, 1, 64, 300, 3, BF16), _case(1, 2, 128, 37, 1, FP16), _case(1, 3, 256, 5, 3, BF16),
    _case(2, 1, 128, 5, 3, FP16), _case(2, 2, 256, 300, 3, BF16), _case(2, 3, 64, 1, 3, FP16),
    _case(8, 1, 256, 37, 3, FP16), _case(8, 2, 64, 300, 1, BF16), _case(8, 3, 128, 37, 3, FP16),
    _case(8, 1, 64, 37, 1, FP16, Hkv=1), _case(8, 1, 128, 300, 3, BF16), _case(8, 1, 256, 300, 3, BF16),
    _case(8, 1, 256, 300, 1, FP16), _case(8, 3, 256, 37, 1, BF16),
]
if torch.cuda.is_available():
    CASES += [_case(G, S, 256, 4128, B, dt, gpu=True) for G, S in ((8, 1), (8, 3), (1, 1), (2, 2))
              for B in (1, 3) for dt in (BF16, FP16)]
    CASES += [_case(8, 1, D, 4128, 3, BF16, gpu=True) for D in (16, 32, 64, 128)]


@pytest.mark.parametrize("G, S, D, L, B, dtype, Hkv", CASES)
def test_matches_float64_reference(G, S, D, L, B, dtype, Hkv):
    seed = G * 1000 + S * 100 + D + L + B
    x, want = make_inputs(B, G, Hkv, S, L, D, dtype, lengths_for(B, L, seed), seed)
    check(run(*x), want, x[3], dtype)


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
def test_many_splits_mostly_empty(dtype):
    """Splits of one 16-slot block, most of them past a short row's visible slots (their log-sum-exp
    is -inf): the combine must weigh them 0 and agree with the default split."""
    x, want = make_inputs(3, 8, 2, 1, 300, 64, dtype, [1, 300, 40], 7)
    o = run(*x, n_splits=19, block_n=16)
    check(o, want, x[3], dtype)
    assert rel_rms(o, run(*x)) <= TOL[dtype]


def test_fully_masked_rows_are_zero():
    """A batch row that may read nothing, and one query of another row: zeros, the rest as usual."""
    x, want = make_inputs(2, 2, 2, 2, 37, 64, BF16, [37, 37], 3, poison=False)
    mask = x[3].clone()
    mask[0] = False
    mask[1, 0, 1] = False
    want = reference(*[t.cpu() for t in x[:3]], mask.cpu(), 64 ** -0.5)
    o = run(*x[:3], mask)
    assert (o[0] == 0).all() and (o[1, :, 1] == 0).all()
    check(o, want, mask, BF16)


@pytest.mark.parametrize("layout", ["mask-1-1-S-L", "mask-B-1-1-L", "strided-q-and-out"])
def test_broadcast_mask_and_strides(layout):
    """A mask that arrives broadcast (stride 0, not copied), q as the model makes it (a transposed
    [B, S, H, D] view) and an output with gaps between rows."""
    B, G, Hkv, S, L, D = 3, 2, 2, 2, 37, 64
    x, _ = make_inputs(B, G, Hkv, S, L, D, FP16, [L] * B, 11, poison=False)
    q, key, value, mask = x
    if layout == "mask-1-1-S-L":
        mask = ragged_mask([20], S, L).to(DEVICE)
    elif layout == "mask-B-1-1-L":
        mask = ragged_mask([5, 37, 20], 1, L).to(DEVICE)
    want = reference(q.cpu(), key.cpu(), value.cpu(), mask.cpu(), D ** -0.5)
    if layout == "strided-q-and-out":
        q = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, H, S, D] view of [B, S, H, D]
        buf = torch.full((B, S, G * Hkv, 2 * D), float("nan"), dtype=FP16, device=DEVICE)
        out = buf[..., :D].transpose(1, 2)
        o = attention_decode(q, key, value, mask, D ** -0.5, out=out)
        assert o is out and torch.isnan(buf[..., D:]).all()  # nothing written outside the view
        o = o.cpu()
    else:
        o = run(q, key, value, mask)
    check(o, want, mask, FP16)


def test_split_count_fills_the_gpu():
    # one sequence of the 1.66B model: 64-slot splits (the minimum), 65 x 2 programs
    assert split_count(1, 2, 4128, 32, 132) == (65, 64)
    for B, Hkv, L in [(1, 2, 4128), (8, 2, 4128), (32, 4, 32800), (1, 1, 1), (3, 2, 300), (64, 2, 4128)]:
        n, keys = split_count(B, Hkv, L, 32, 132)
        assert keys % 32 == 0 and (n - 1) * keys < L <= n * keys  # none empty, all covered
        assert n == 1 or keys >= 64
        # about 4 programs per SM, unless the 64-slot minimum leaves fewer
        assert B * Hkv * n >= min(4 * 132, B * Hkv * -(-L // 64)) // 2


def test_supports():
    def t(*shape, dtype=BF16):
        return torch.empty(*shape, dtype=dtype)

    mask = torch.ones(1, 1, 1, 300, dtype=torch.bool)
    assert supports(t(2, 16, 1, 256), t(2, 2, 300, 256), t(2, 2, 300, 256), mask)
    assert supports(t(2, 16, 2, 256), t(2, 2, 300, 256), t(2, 2, 300, 256), mask.expand(2, 1, 2, 300))
    assert max_rows(256) == 32 and max_rows(128) == 64
    assert not supports(t(2, 16, 5, 256), t(2, 2, 300, 256), t(2, 2, 300, 256), mask)  # 40 rows
    assert not supports(t(2, 16, 1, 96), t(2, 2, 300, 96), t(2, 2, 300, 96), mask)  # D not 2^k
    assert not supports(t(2, 16, 1, 64, dtype=torch.float32), t(2, 2, 300, 64, dtype=torch.float32),
                        t(2, 2, 300, 64, dtype=torch.float32), mask)
    assert not supports(t(2, 16, 1, 64), t(2, 2, 300, 64), t(2, 2, 300, 64), mask.float())
    assert not supports(t(2, 16, 1, 64), t(2, 3, 300, 64), t(2, 3, 300, 64), mask)  # H % Hkv
    with pytest.raises(ValueError, match="unsupported"):
        attention_decode(t(2, 16, 1, 96), t(2, 2, 300, 96), t(2, 2, 300, 96), mask, 1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none found)")
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("B, H, Hkv, S, lengths", [(1, 16, 2, 1, [4128]), (4, 16, 4, 1, [1, 100, 4128, 2000]),
                                                    (3, 16, 2, 2, [2, 4128, 77])],
                         ids=["B1-gqa8-decode", "B4-gqa4-decode", "B3-gqa8-S2"])
def test_public_op_matches_sdpa_path(dtype, B, H, Hkv, S, lengths):
    """gdn::attention on CUDA takes the kernel at decode shapes, agrees with its SDPA route, and
    replays from a CUDA graph."""
    from gdn_export.ops.attention import _attention_sdpa, _triton_kernel, attention

    L, D = 4128, 256
    (q, key, value, mask), want = make_inputs(B, H // Hkv, Hkv, S, L, D, dtype, lengths, 5, poison=False)
    got = attention(q, key, value, mask, D ** -0.5)
    assert torch.equal(got, _triton_kernel("attention_decode").attention_decode(q, key, value, mask, D ** -0.5))  # the kernel ran
    sdpa = _attention_sdpa(q, key, value, mask, D ** -0.5)
    assert rel_rms(got.float(), sdpa.float()) <= 2 * TOL[dtype]
    assert rel_rms(got.cpu(), want) <= TOL[dtype]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = attention(q, key, value, mask, D ** -0.5)
    q.copy_(torch.randn_like(q))
    graph.replay()
    assert rel_rms(replayed.cpu(), reference(q.cpu(), key.cpu(), value.cpu(), mask.cpu(), D ** -0.5)) <= TOL[dtype]



@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none found)")
def test_public_op_under_torch_compile():
    """The op stays opaque to torch.compile (fullgraph) and gives the eager result."""
    from gdn_export.ops.attention import attention

    (q, key, value, mask), _ = make_inputs(2, 8, 2, 1, 4128, 256, BF16, [4128, 300], 9, poison=False)
    fn = torch.compile(lambda *x: attention(*x, 256 ** -0.5), fullgraph=True)
    assert torch.equal(fn(q, key, value, mask), attention(q, key, value, mask, 256 ** -0.5))
