"""Triton quantized-linear kernels (gdn_export/ops/quant_linear/gpu.py, triton_*.py) against the
independent fp64 reference of the contract: on CPU under TRITON_INTERPRET=1 (tests/ops/conftest.py
sets it when no GPU is present), compiled on a GPU where there is one (inputs made on the CPU, moved
by `on_device`); tests/ops/test_quant_linear_gpu.py adds real sizes on a GPU. Every buffer the
launchers allocate is NaN-filled first."""

from __future__ import annotations

import pytest
import torch

from kernels.quant_linear import gpu
from kernels.quant_linear.triton import common as triton_common
from kernels.quant_linear.triton.common import e4m3_round  # noqa: F401  (jit helper under test)
from tests.conftest import DTYPES
from tests.ops.quant_linear.cases import (
    TOL, activations, block_weights, fp8_weights, input_scale_for, int4_weights, nan_empty, ref_fp8_block_linear,
    ref_fp8_linear, ref_int4_linear, rel_rms)

# (M, K, N): decode rows 1 / 3 (skinny tiles, split K), 65 (prefill tiles); K not a multiple of 128;
# N = 1, 63, 130.
SHAPES = {
    "M1-K200-N63": (1, 200, 63),
    "M3-K384-N130": (3, 384, 130),
    "M65-K136-N1": (65, 136, 1),
    "M65-K264-N130": (65, 264, 130),
}
KINDS = ["random", "model"]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def on_device(fn):
    """fn with its tensor arguments moved to DEVICE and its result brought back to the CPU, where
    the references run."""
    def run(*args, **kwargs):
        move = lambda t: t.to(DEVICE) if isinstance(t, torch.Tensor) else t  # noqa: E731
        return fn(*map(move, args), **{k: move(v) for k, v in kwargs.items()}).cpu()
    return run


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(triton_common, "empty", nan_empty)


def _check(y, ref, dtype, shape, name):
    assert y.dtype == dtype and tuple(y.shape) == tuple(shape), f"{name}: {y.dtype} {tuple(y.shape)}"
    err = rel_rms(y, ref)
    assert err <= TOL[dtype], f"{name}: relative RMS {err:.3g} > {TOL[dtype]:g} ({dtype})"


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_fp8_linear(shape, dtype, kind, bias):
    M, K, N = shape
    gen = torch.Generator().manual_seed(M * 7 + K + N)
    x = activations(M, K, dtype, kind, gen)
    w, ws = fp8_weights(N, K, gen)
    s_in = input_scale_for(x)
    b = torch.randn(N, generator=gen).to(dtype) if bias else None
    y = on_device(gpu.fp8_linear)(x, w, ws, s_in, b)
    _check(y, ref_fp8_linear(x, w, ws, s_in, b), dtype, (M, N), "fp8_linear")


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_fp8_block_linear(shape, dtype, kind, bias):
    M, K, N = shape
    gen = torch.Generator().manual_seed(M * 5 + K + N)
    x = activations(M, K, dtype, kind, gen)
    w, wsi = block_weights(N, K, gen)
    b = torch.randn(N, generator=gen).to(dtype) if bias else None
    y = on_device(gpu.fp8_block_linear)(x, w, wsi, b)
    _check(y, ref_fp8_block_linear(x, w, wsi, b), dtype, (M, N), "fp8_block_linear")


INT4_SHAPES = dict(SHAPES, **{"M3-K131-N63-oddK": (3, 131, 63)})


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", list(INT4_SHAPES.values()), ids=list(INT4_SHAPES))
def test_int4_linear(shape, dtype, kind, bias):
    M, K, N = shape
    gen = torch.Generator().manual_seed(M * 3 + K + N)
    x = activations(M, K, dtype, kind, gen)
    qw, sc = int4_weights(N, K, 128, dtype, gen)
    b = torch.randn(N, generator=gen).to(dtype) if bias else None
    y = on_device(gpu.int4_linear)(x, qw, sc, b)
    _check(y, ref_int4_linear(x, qw, sc, b), dtype, (M, N), "int4_linear")


@pytest.mark.parametrize("group_size", [32, 64, 256, 48], ids=lambda g: f"g{g}")
@pytest.mark.parametrize("M", [2, 40], ids=lambda m: f"M{m}")
def test_int4_group_sizes(group_size, M):
    """Tiles of 32 / 64 / 128 along K follow the group; 48 (no power-of-two tile) takes the torch path."""
    K, N, dtype = 200, 70, torch.bfloat16
    gen = torch.Generator().manual_seed(group_size + M)
    x = activations(M, K, dtype, "model", gen)
    qw, sc = int4_weights(N, K, group_size, dtype, gen)
    y = on_device(gpu.int4_linear)(x, qw, sc, None, group_size=group_size)
    _check(y, ref_int4_linear(x, qw, sc, None, group_size), dtype, (M, N), f"int4 g{group_size}")


def test_leading_dims_and_strided_rows():
    """x [B, T, K] and a column slice (row stride > K) give the same result as the dense 2-D input."""
    gen = torch.Generator().manual_seed(11)
    base = activations(6, 300, torch.bfloat16, "random", gen)
    x = base[:, :256]  # row stride 300
    w, wsi = block_weights(40, 256, gen)
    y = on_device(gpu.fp8_block_linear)(x.reshape(2, 3, 256), w, wsi)
    assert y.shape == (2, 3, 40)
    _check(y.reshape(6, 40), ref_fp8_block_linear(x.contiguous(), w, wsi), torch.bfloat16, (6, 40), "3-d strided")


def test_e4m3_rounding_matches_torch():
    """The in-kernel quantization rounds ties to even (1.0625 -> 1.0), saturates at 448 and keeps
    subnormals, exactly as torch's float8_e4m3fn cast: checked through fp8_linear with a unit weight."""
    vals = torch.tensor([1.0625, 1.1875, -1.0625, 2 ** -10 * 1.5, 2 ** -10 * 2.5, 2 ** -10 * 0.5,
                         2 ** -7 * 1.03125, 0.0, 447.0, 460.0, 470.0, -1000.0, 3.3, -0.0123])
    K = vals.numel()
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([vals[None], torch.randn(2, K, generator=gen) * 50])
    w = torch.eye(K).to(torch.float8_e4m3fn)
    y = on_device(gpu.fp8_linear)(x, w, torch.ones(K), torch.tensor(1.0))
    expected = x.clamp(-448, 448).to(torch.float8_e4m3fn).float()
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_int4_triton_gemm_prefill_tiles(dtype):
    """The Triton W4A16 prefill tiles (gpu.py takes them for fp32 x; 16-bit x dequantizes first)."""
    from kernels.quant_linear.triton.int4 import int4_gemm
    M, K, N = 65, 264, 130
    gen = torch.Generator().manual_seed(3)
    x = activations(M, K, dtype, "model", gen)
    qw, sc = int4_weights(N, K, 128, dtype, gen)
    b = torch.randn(N, generator=gen).to(dtype)
    _check(on_device(int4_gemm)(x, qw, sc, b), ref_int4_linear(x, qw, sc, b), dtype, (M, N), "int4_gemm")


@pytest.mark.parametrize("K,gs", [(131, 32), (130, 32), (512, 128), (1056, 96)],
                         ids=["K131-odd", "K130-gs32", "K512-gs128", "K1056-gs96"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_int4_dequant_kernel_exact(dtype, K, gs):
    """W = int4 * scale rounded once to x's dtype, every element written (odd K: padding nibble dropped;
    even K: each byte's two values stored as one 32-bit word)."""
    from kernels.quant_linear.triton.int4 import int4_dequant
    from tests.ops.quant_linear.cases import unpack_int4
    N = 37
    gen = torch.Generator().manual_seed(5)
    qw, sc = int4_weights(N, K, gs, dtype, gen)
    w = on_device(int4_dequant)(qw, sc, K, gs, dtype)
    expected = (unpack_int4(qw, K).float() * sc.float().repeat_interleave(gs, 1)[:, :K]).to(dtype)
    torch.testing.assert_close(w, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_int4_every_byte_exact(dtype):
    """Every byte value's two nibbles, exactly, through int4_dequant and the skinny GEMM (even and odd k
    through the low / high nibble dots): the nibble conversion of triton_utils.int4_nibbles."""
    from kernels.quant_linear.triton import skinny
    from kernels.quant_linear.triton.int4 import int4_dequant
    from tests.ops.quant_linear.cases import every_byte_int4, unpack_int4
    qw, sc, x, cols = every_byte_int4(dtype)
    K = x.shape[1]
    expected = unpack_int4(qw, K)
    if dtype != torch.float32:
        w = on_device(int4_dequant)(qw, sc, K, 32, dtype)
        torch.testing.assert_close(w, expected.to(dtype), rtol=0, atol=0)
    for nibbles in (1, 2):
        y = on_device(skinny.skinny)(skinny.INT4, x, qw, sc, None, None, 32, cfg=dict(nibbles=nibbles))
        torch.testing.assert_close(y, expected[:, cols].t().to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("KN", [(200, 63), (384, 130), (1000, 1)], ids=lambda kn: f"K{kn[0]}-N{kn[1]}")
def test_gemv_route_all_formats(KN, dtype, bias, monkeypatch):
    """One-row x through the CUDA-core GEMV (triton_gemv.py; gpu.py takes it when triton_common.GEMV)."""
    monkeypatch.setattr(triton_common, "GEMV", True)
    K, N = KN
    gen = torch.Generator().manual_seed(K + N)
    x = activations(1, K, dtype, "model", gen)
    b = torch.randn(N, generator=gen).to(dtype) if bias else None
    w, ws = fp8_weights(N, K, gen)
    s_in = input_scale_for(x)
    _check(on_device(gpu.fp8_linear)(x, w, ws, s_in, b), ref_fp8_linear(x, w, ws, s_in, b), dtype, (1, N), "gemv fp8")
    wb, wsi = block_weights(N, K, gen)
    _check(on_device(gpu.fp8_block_linear)(x, wb, wsi, b), ref_fp8_block_linear(x, wb, wsi, b), dtype, (1, N),
           "gemv block")
    qw, sc = int4_weights(N, K, 128, dtype, gen)
    _check(on_device(gpu.int4_linear)(x, qw, sc, b), ref_int4_linear(x, qw, sc, b), dtype, (1, N), "gemv int4")


# ---------------------------------------------------------------- the skinny (decode) GEMM
from kernels.quant_linear.triton import skinny  # noqa: E402
from tests.ops.quant_linear.cases import pre_scales  # noqa: E402

# launch configurations the benchmark's sweep times (a K tile of 256, 64-row tiles, bf16 MMAs, the
# nibble conversion on 4 bytes an instance (the default: 2), x's one row quantized alone at M = 1 and
# not (the default: alone)); (3, 384, 128) and (1, 384, 128): tiles that divide K and N (no masks)
SKINNY_CFGS = {"default": None, "BK256": dict(BK=256, stages=3), "BN64": dict(BN=64, per_sm=4),
               "bf16-mma": dict(dot_fp8=False), "nibbles1": dict(nibbles=1), "one-row": dict(one_row=True),
               "tile-row": dict(one_row=False)}


SKINNY_CASES = [(mkn, dtype, "default") for mkn in [(1, 520, 70), (64, 264, 130), (17, 1000, 257), (3, 384, 128)]
                for dtype in (torch.float32, torch.float16, torch.bfloat16)] \
    + [((64, 264, 130), torch.bfloat16, cfg) for cfg in SKINNY_CFGS if cfg not in ("default", "one-row", "tile-row")] \
    + [(mkn, dtype, cfg) for mkn in [(1, 520, 70), (1, 384, 128)] for dtype in (torch.float16, torch.bfloat16)
       for cfg in ("one-row", "tile-row")]


@pytest.mark.parametrize("MKN,dtype,cfg", SKINNY_CASES,
                         ids=["M%d-K%d-N%d-%s-%s" % (*c[0], str(c[1])[6:], c[2]) for c in SKINNY_CASES])
def test_skinny_all_formats(MKN, dtype, cfg):
    """The decode GEMM of every format (M up to MAX_M = 64, split K, ragged K and N) with bias and, for
    int4, the AWQ pre_scale applied in the tile."""
    M, K, N = MKN
    cfg = SKINNY_CFGS[cfg]
    gen = torch.Generator().manual_seed(M + K + N)
    x = activations(M, K, dtype, "model", gen)
    b = torch.randn(N, generator=gen).to(dtype)
    w, ws = fp8_weights(N, K, gen)
    s_in = input_scale_for(x)
    run = on_device(skinny.skinny)
    _check(run(skinny.FP8_TENSOR, x, w, ws, s_in, b, cfg=cfg), ref_fp8_linear(x, w, ws, s_in, b), dtype, (M, N),
           "skinny fp8")
    wb, wsi = block_weights(N, K, gen)
    _check(run(skinny.FP8_BLOCK, x, wb, wsi, None, b, cfg=cfg), ref_fp8_block_linear(x, wb, wsi, b), dtype, (M, N),
           "skinny fp8 block")
    qw, sc = int4_weights(N, K, 128, dtype, gen)
    pre = pre_scales(K, dtype, gen)
    _check(run(skinny.INT4, x, qw, sc, None, b, 128, pre, cfg=cfg), ref_int4_linear(x, qw, sc, b, 128, pre), dtype,
           (M, N), "skinny int4 awq")


@pytest.mark.parametrize("group_size", [32, 64, 256], ids=lambda g: f"g{g}")
def test_skinny_int4_group_sizes(group_size, monkeypatch):
    """K tiles follow the int4 group (BK = min(128, group)), through the op's skinny route."""
    monkeypatch.setattr(gpu, "SKINNY_DECODE", True)
    M, K, N, dtype = 5, 700, 90, torch.bfloat16
    gen = torch.Generator().manual_seed(group_size)
    x = activations(M, K, dtype, "model", gen)
    qw, sc = int4_weights(N, K, group_size, dtype, gen)
    pre = pre_scales(K, dtype, gen)
    y = on_device(gpu.int4_linear)(x, qw, sc, None, group_size, pre)
    _check(y, ref_int4_linear(x, qw, sc, None, group_size, pre), dtype, (M, N), f"int4 g{group_size} awq")


@pytest.mark.parametrize("skinny_route", [False, True], ids=["default", "skinny"])
@pytest.mark.parametrize("M", [2, 65], ids=lambda m: f"M{m}")
def test_int4_pre_scale_every_route(M, skinny_route, monkeypatch):
    """pre_scale through the op: applied in the tile (skinny route, M <= 64), or x scaled first (the
    Triton W4A16 GEMM, and the prefill route)."""
    monkeypatch.setattr(gpu, "SKINNY_DECODE", skinny_route)
    K, N, dtype = 264, 130, torch.bfloat16
    gen = torch.Generator().manual_seed(M)
    x = activations(M, K, dtype, "model", gen)
    qw, sc = int4_weights(N, K, 128, dtype, gen)
    pre = pre_scales(K, dtype, gen)
    _check(on_device(gpu.int4_linear)(x, qw, sc, None, 128, pre), ref_int4_linear(x, qw, sc, None, 128, pre), dtype,
           (M, N), "int4 awq")


@pytest.mark.parametrize("K,split", [(2600, 21), (2048, 16)], ids=["K2600-split21", "K2048-split16"])
@pytest.mark.parametrize("M", [1, 3], ids=lambda m: f"M{m}")
def test_skinny_deep_split(M, K, split, monkeypatch):
    """Split K as deep as on a GPU's 132 multiprocessors (the interpreter's 4 give <= 8 splits), one K
    tile a program (min_tiles 1): the last program of each column tile sums 16 or 21 partials; every
    format against the reference, and the partial buffer had `split` splits."""
    monkeypatch.setattr(skinny, "device_sms", lambda t: 32)
    splits = []

    def recording_empty(*shape, dtype, device):
        if len(shape) == 3:  # the split-K partials [SPLIT, M, N]
            splits.append(shape[0])
        return nan_empty(*shape, dtype=dtype, device=device)

    N, dtype = 70, torch.bfloat16
    gen = torch.Generator().manual_seed(K + M)
    x = activations(M, K, dtype, "model", gen)
    w, ws = fp8_weights(N, K, gen)
    s_in = input_scale_for(x)
    run = on_device(lambda *a: skinny.skinny(*a, cfg=dict(min_tiles=1)))  # no cap on the split
    wb, wsi = block_weights(N, K, gen)
    qw, sc = int4_weights(N, K, 128, dtype, gen)
    for fmt, args in ((skinny.FP8_TENSOR, (w, ws, s_in)), (skinny.FP8_BLOCK, (wb, wsi)), (skinny.INT4, (qw, sc))):
        run(fmt, x, *args)  # compiles and reads the occupancy (on a GPU, a compile-only launch allocates too)
    monkeypatch.setattr(triton_common, "empty", recording_empty)
    _check(run(skinny.FP8_TENSOR, x, w, ws, s_in), ref_fp8_linear(x, w, ws, s_in, None), dtype, (M, N), "fp8")
    _check(run(skinny.FP8_BLOCK, x, wb, wsi), ref_fp8_block_linear(x, wb, wsi, None), dtype, (M, N), "fp8 block")
    _check(run(skinny.INT4, x, qw, sc), ref_int4_linear(x, qw, sc, None), dtype, (M, N), "int4")
    assert splits == [split] * 3, splits

def test_skinny_refuses_bad_launches():
    x = torch.zeros(65, 64)
    with pytest.raises(ValueError, match="more than 64"):
        skinny.skinny(skinny.FP8_TENSOR, x, torch.zeros(8, 64).to(torch.float8_e4m3fn), torch.ones(8), torch.tensor(1.0))
    with pytest.raises(ValueError, match="multiple of 32"):
        skinny.skinny(skinny.INT4, x[:2], torch.zeros(8, 32, dtype=torch.uint8), torch.ones(8, 4), None, None, 16)


@pytest.mark.parametrize("KN", [(520, 70), (2048, 256)], ids=lambda kn: f"K{kn[0]}-N{kn[1]}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_one_row_equals_the_tile_quantization(dtype, KN, monkeypatch):
    """At M = 1 the fp8 formats' one_row launch (x's row quantized as a vector, placed as row 0 of the
    MMA operand) gives the default launch's output bit for bit: the same quotients, roundings and
    products, the other rows zero in both; the launches' ONE_ROW flags are recorded to show which
    path ran."""
    real, seen = skinny.skinny_kernel, []

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append(kwargs["ONE_ROW"])
                return real[grid](*args, **kwargs)
            return launch

        def __getattr__(self, name):
            return getattr(real, name)

    monkeypatch.setattr(skinny, "skinny_kernel", Recorder())
    K, N = KN
    gen = torch.Generator().manual_seed(K)
    x = activations(1, K, dtype, "model", gen)
    w, ws = fp8_weights(N, K, gen)
    wb, wsi = block_weights(N, K, gen)
    run = on_device(skinny.skinny)
    for fmt, args in ((skinny.FP8_TENSOR, (w, ws, input_scale_for(x))), (skinny.FP8_BLOCK, (wb, wsi))):
        tile, one = run(fmt, x, *args, cfg=dict(one_row=False)), run(fmt, x, *args, cfg=dict(one_row=True))
        assert not torch.isnan(one).any() and torch.equal(one, tile), fmt
    assert seen == [False, True, False, True], seen


@pytest.mark.parametrize("skinny_route", [False, True], ids=["default", "skinny"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("M", [1, 40, 100], ids=lambda m: f"M{m}")
def test_activation_quantization_is_the_exact_quotient(M, dtype, skinny_route, monkeypatch):
    """x / input_scale rounded as IEEE division before e4m3 (x * (1 / s) moves near-tie elements, which
    16-bit x over a scale made from 16-bit values hits often), through every route (the Triton skinny
    GEMMs of fp8.py and skinny.py, the prefill GEMM): with an identity weight, y is e4m3(x / s) * s
    exactly."""
    monkeypatch.setattr(gpu, "SKINNY_DECODE", skinny_route)
    K = 256
    gen = torch.Generator().manual_seed(M)
    x = activations(M, K, dtype, "model", gen)
    s = input_scale_for(x)
    w = torch.eye(K).to(torch.float8_e4m3fn)
    y = on_device(gpu.fp8_linear)(x, w, torch.ones(K), s)
    want = ((x.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s).to(dtype)
    torch.testing.assert_close(y, want, rtol=0, atol=0)


@pytest.mark.parametrize("M,K,strided", [(1, 7, False), (37, 130, True), (300, 2048, False), (5, 3000, True)],
                         ids=["M1-K7", "M37-K130-strided", "M300-K2048", "M5-K3000-strided"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_scale_columns_rounds_as_torch(dtype, M, K, strided):
    """AWQ's pre-scale pass: x * s rounded once, bit for bit torch's x * s, every element written
    (outputs poisoned by the autouse fixture), x with a row stride wider than K. bf16 under Triton's
    interpreter (truncating casts): within one bf16 ulp."""
    from kernels.quant_linear.triton.int4 import scale_columns

    gen = torch.Generator().manual_seed(M + K)
    wide = (torch.randn(M, K + 5 if strided else K, generator=gen) * 4).to(dtype).to(DEVICE)
    x = wide[:, :K]
    s = (torch.rand(K, generator=gen) * 3 + 0.05).to(dtype)
    y = scale_columns(x, s.to(DEVICE))
    assert y.is_contiguous()
    y, x = y.cpu(), x.cpu()
    if DEVICE == "cpu" and dtype == torch.bfloat16:  # the interpreter casts to bf16 by truncation
        assert ((y.float() - (x * s).float()).abs() <= (x.float() * s.float()).abs() * 2.0 ** -7).all()
    else:
        torch.testing.assert_close(y, x * s, rtol=0, atol=0)


@pytest.mark.parametrize("M,K", [(1, 16), (3, 7), (37, 1030), (130, 2048)], ids=["M1-K16", "M3-K7", "M37-K1030", "M130-K2048"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_tensor_is_the_contracts_quotient(dtype, M, K):
    """The prefill's x pass (fp8_linear's torch._scaled_mm route): e4m3(clamp(x / input_scale, +-448))
    bit for bit torch's, and input_scale in every row of the [M, 1] scale; a tile of several rows
    meets row and column edges (outputs poisoned by the autouse fixture)."""
    from kernels.quant_linear.triton.fp8 import quantize_tensor

    gen = torch.Generator().manual_seed(M * K)
    x = activations(M, K, dtype, "model", gen)
    s = torch.tensor(float(x.float().abs().max()) / 300.0)  # some elements past +-448 after the division
    xq, rs = on_device(lambda a, b: torch.cat(
        [t.float().reshape(M, -1) for t in quantize_tensor(a, b)], 1))(x, s).split([K, 1], 1)
    want = (x.float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()
    torch.testing.assert_close(xq, want, rtol=0, atol=0)
    torch.testing.assert_close(rs, s.expand(M, 1), rtol=0, atol=0)
