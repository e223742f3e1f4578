"""GPU paths of the quantized linear ops (gdn_export/ops/quant_linear/gpu.py) on CUDA against the
independent fp64 reference of the contract (tests/ops/quant_linear/cases.py): the Triton skinny
(decode, split-K) and prefill launches, torch._scaled_mm's rowwise FP8 path, real model shapes,
CUDA-graph capture and replay. Every buffer the Triton launchers allocate is NaN-filled first."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import DTYPES, GPU_ONLY
from tests.ops.quant_linear.cases import (
    TOL, activations, block_weights, fp8_weights, input_scale_for, int4_weights, nan_empty, pre_scales,
    ref_fp8_block_linear, ref_fp8_linear, ref_int4_linear, rel_rms)

pytestmark = GPU_ONLY

if torch.cuda.is_available():
    from kernels import triton_utils
    from kernels.quant_linear import gpu
    from kernels.quant_linear.triton import common as triton_common, fp8 as triton_fp8, int4 as triton_int4

# (M, K, N): odd small shapes, the decode range edges (1, 32), the first prefill size (33), and
# model shapes of the 1.66B Qwen3.5 (hidden 2048, GDN value dim 4096, MLP 6144, k/v 512).
SHAPES = {
    "M1-K200-N63": (1, 200, 63),
    "M3-K384-N130": (3, 384, 130),
    "M65-K136-N1": (65, 136, 1),
    "M65-K264-N130": (65, 264, 130),
    "M1-K2048-N512": (1, 2048, 512),
    "M8-K2048-N12288": (8, 2048, 12288),  # a fused q|k|v|z or gate|up group
    "M32-K4096-N2048": (32, 4096, 2048),
    "M33-K2048-N6144": (33, 2048, 6144),
    "M64-K6144-N2048": (64, 6144, 2048),  # the last row count of the skinny GEMM
    "M65-K2048-N9216": (65, 2048, 9216),  # the first of the prefill routes
    "M300-K6144-N2048": (300, 6144, 2048),
    "M257-K2048-N520": (257, 2048, 520),
}


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(triton_common, "empty", nan_empty)


def _check(y, ref, dtype, shape, name):
    assert y.dtype == dtype and tuple(y.shape) == tuple(shape), f"{name}: {y.dtype} {tuple(y.shape)}"
    err = rel_rms(y, ref.to(y.device))
    assert err <= TOL[dtype], f"{name}: relative RMS {err:.3g} > {TOL[dtype]:g} ({dtype})"


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("kind", ["random", "model"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_fp8_linear_gpu(shape, dtype, kind):
    M, K, N = shape
    gen = _gen(M + K + N)
    x = activations(M, K, dtype, kind, gen)
    w, ws = fp8_weights(N, K, gen)
    s_in = input_scale_for(x)
    b = torch.randn(N, generator=gen).to(dtype) if kind == "model" else None
    ref = ref_fp8_linear(x, w, ws, s_in, b)
    y = gpu.fp8_linear(*(t.cuda() if t is not None else None for t in (x, w, ws, s_in, b)))
    _check(y, ref, dtype, (M, N), "fp8_linear")


PREFILL = {name: s for name, s in SHAPES.items() if s[0] > 64}


@pytest.mark.parametrize("kind", ["random", "model"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", list(PREFILL.values()), ids=list(PREFILL))
def test_fp8_prefill_fast_accum_gpu(shape, dtype, kind, monkeypatch):
    """The rowwise prefill GEMM with cuBLASLt's fast accumulation (gpu.FP8_FAST_ACCUM) within the same
    bound of the exact product of the quantized operands as the default."""
    monkeypatch.setattr(gpu, "FP8_FAST_ACCUM", True)
    real, fast = torch._scaled_mm, []

    def scaled_mm(*args, **kwargs):
        fast.append(kwargs.get("use_fast_accum", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    M, K, N = shape
    gen = _gen(M + K + N + 1)
    x = activations(M, K, dtype, kind, gen)
    w, ws = fp8_weights(N, K, gen)
    s_in = input_scale_for(x)
    ref = ref_fp8_linear(x, w, ws, s_in, None)
    y = gpu.fp8_linear(*(t.cuda() for t in (x, w, ws, s_in)))
    _check(y, ref, dtype, (M, N), "fp8_linear fast accumulation")
    if N % 16 == 0 and K % 16 == 0:  # the rowwise route's shapes: it ran, with fast accumulation
        assert fast and fast[-1] is True, f"torch._scaled_mm calls' use_fast_accum: {fast}"


@pytest.mark.parametrize("kind", ["random", "model"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_fp8_block_linear_gpu(shape, dtype, kind):
    M, K, N = shape
    gen = _gen(M * 3 + K + N)
    x = activations(M, K, dtype, kind, gen)
    w, wsi = block_weights(N, K, gen)
    b = torch.randn(N, generator=gen).to(dtype) if kind == "model" else None
    ref = ref_fp8_block_linear(x, w, wsi, b)
    y = gpu.fp8_block_linear(*(t.cuda() if t is not None else None for t in (x, w, wsi, b)))
    _check(y, ref, dtype, (M, N), "fp8_block_linear")


@pytest.mark.parametrize("kind", ["random", "model"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", list(SHAPES.values()) + [(3, 131, 63)], ids=list(SHAPES) + ["M3-K131-N63"])
def test_int4_linear_gpu(shape, dtype, kind):
    M, K, N = shape
    gen = _gen(M * 5 + K + N)
    x = activations(M, K, dtype, kind, gen)
    qw, sc = int4_weights(N, K, 128, dtype, gen)
    b = torch.randn(N, generator=gen).to(dtype) if kind == "model" else None
    pre = pre_scales(K, dtype, gen) if kind == "model" else None  # AWQ's pre_scale with the model-like x
    ref = ref_int4_linear(x, qw, sc, b, 128, pre)
    y = gpu.int4_linear(*(t.cuda() if t is not None else None for t in (x, qw, sc, b)), 128,
                        None if pre is None else pre.cuda())
    _check(y, ref, dtype, (M, N), "int4_linear")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M", [1, 8, 33, 64], ids=lambda m: f"M{m}")
def test_skinny_route_gpu(M, dtype, monkeypatch):
    """gpu.SKINNY_DECODE: M <= 64 of every format through triton/skinny.py on model shapes (a fused
    2048 -> 12288 group, 6144 -> 2048) and a ragged one, with bias and int4's AWQ pre_scale."""
    monkeypatch.setattr(gpu, "SKINNY_DECODE", True)
    for K, N in ((2048, 12288), (6144, 2048), (200, 63)):
        gen = _gen(M + N)
        x = activations(M, K, dtype, "model", gen)
        b = torch.randn(N, generator=gen).to(dtype)
        w, ws = fp8_weights(N, K, gen)
        s_in = input_scale_for(x)
        _check(gpu.fp8_linear(x.cuda(), w.cuda(), ws.cuda(), s_in.cuda(), b.cuda()), ref_fp8_linear(x, w, ws, s_in, b),
               dtype, (M, N), "skinny fp8")
        wb, wsi = block_weights(N, K, gen)
        _check(gpu.fp8_block_linear(x.cuda(), wb.cuda(), wsi.cuda(), b.cuda()), ref_fp8_block_linear(x, wb, wsi, b),
               dtype, (M, N), "skinny fp8 block")
        qw, sc = int4_weights(N, K, 128, dtype, gen)
        pre = pre_scales(K, dtype, gen)
        _check(gpu.int4_linear(x.cuda(), qw.cuda(), sc.cuda(), b.cuda(), 128, pre.cuda()),
               ref_int4_linear(x, qw, sc, b, 128, pre), dtype, (M, N), "skinny int4")


@pytest.mark.parametrize("ptx", [1, 2, 0], ids=["ptx4", "ptx2", "shifts"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_int4_every_byte_exact_gpu(dtype, ptx, monkeypatch):
    """Every byte value's two nibbles, exactly, through int4_dequant and the skinny GEMM (the low / high
    nibble dots against x's even / odd columns), with the PTX nibble conversion on 4 or 2 bytes an
    instance (16-bit) and without."""
    monkeypatch.setattr(triton_utils, "NIBBLE_PTX", ptx)
    from kernels.quant_linear.triton import skinny
    from tests.ops.quant_linear.cases import every_byte_int4, unpack_int4
    qw, sc, x, cols = every_byte_int4(dtype)
    K = x.shape[1]
    expected = unpack_int4(qw, K)
    if dtype != torch.float32:
        w = triton_int4.int4_dequant(qw.cuda(), sc.cuda(), K, 32, dtype).cpu()
        torch.testing.assert_close(w, expected.to(dtype), rtol=0, atol=0)
    y = skinny.skinny(skinny.INT4, x.cuda(), qw.cuda(), sc.cuda(), None, None, 32).cpu()
    torch.testing.assert_close(y, expected[:, cols].t().to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("group_size", [32, 64, 256, 48], ids=lambda g: f"g{g}")
def test_int4_group_sizes_gpu(group_size):
    M, K, N, dtype = 40, 1000, 300, torch.float16
    gen = _gen(group_size)
    x = activations(M, K, dtype, "model", gen)
    qw, sc = int4_weights(N, K, group_size, dtype, gen)
    y = gpu.int4_linear(x.cuda(), qw.cuda(), sc.cuda(), None, group_size=group_size)
    _check(y, ref_int4_linear(x, qw, sc, None, group_size), dtype, (M, N), f"int4 g{group_size}")


def test_scaled_mm_rowwise_form_is_available():
    """torch._scaled_mm takes rowwise fp32 scales with bf16 output here (H200, torch 2.11): the FP8
    prefill path of fp8_linear is cuBLAS's. Its blockwise form is only probed, not required (torch
    2.11 refused it on the H200): where it is refused fp8_block_linear takes the Triton block GEMM,
    and test_fp8_block_linear_gpu holds the result to the reference either way."""
    device = torch.device("cuda", torch.cuda.current_device())
    assert gpu._scaled_mm_ok(torch.bfloat16, False, device), \
        f"torch {torch.__version__}: _scaled_mm's rowwise form refused or wrong"
    assert isinstance(gpu._scaled_mm_ok(torch.bfloat16, False, device, blockwise=True), bool)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(300, 2048, 1024), (129, 640, 200)], ids=["M300-K2048-N1024", "M129-K640-N200"])
def test_triton_prefill_gemms_gpu(shape, dtype):
    """The Triton prefill GEMMs called directly (gpu.py routes 16-bit x of aligned shapes to cuBLAS):
    fp8 per-channel, fp8 128-block and W4A16."""
    M, K, N = shape
    gen = _gen(M + N)
    x = activations(M, K, dtype, "model", gen)
    b = torch.randn(N, generator=gen).to(dtype)
    w, ws = fp8_weights(N, K, gen)
    s_in = input_scale_for(x)
    y = triton_fp8.fp8_gemm(x.cuda(), w.cuda(), ws.cuda(), s_in.cuda(), b.cuda(), blockwise=False)
    _check(y, ref_fp8_linear(x, w, ws, s_in, b), dtype, (M, N), "triton fp8 per-channel")
    wb, wsi = block_weights(N, K, gen)
    y = triton_fp8.fp8_gemm(x.cuda(), wb.cuda(), wsi.cuda(), None, b.cuda(), blockwise=True)
    _check(y, ref_fp8_block_linear(x, wb, wsi, b), dtype, (M, N), "triton fp8 block")
    qw, sc = int4_weights(N, K, 128, dtype, gen)
    y = triton_int4.int4_gemm(x.cuda(), qw.cuda(), sc.cuda(), b.cuda())
    _check(y, ref_int4_linear(x, qw, sc, b), dtype, (M, N), "triton int4")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("KN", [(2048, 8192), (6144, 2048), (200, 63)], ids=lambda kn: f"K{kn[0]}-N{kn[1]}")
def test_gemv_route_gpu(KN, dtype, monkeypatch):
    """One-row x through the CUDA-core GEMV (triton_gemv.py) for the three formats, with bias."""
    monkeypatch.setattr(triton_common, "GEMV", True)
    K, N = KN
    gen = _gen(K + N)
    x = activations(1, K, dtype, "model", gen)
    b = torch.randn(N, generator=gen).to(dtype)
    w, ws = fp8_weights(N, K, gen)
    s_in = input_scale_for(x)
    _check(gpu.fp8_linear(x.cuda(), w.cuda(), ws.cuda(), s_in.cuda(), b.cuda()),
           ref_fp8_linear(x, w, ws, s_in, b), dtype, (1, N), "gemv fp8")
    wb, wsi = block_weights(N, K, gen)
    _check(gpu.fp8_block_linear(x.cuda(), wb.cuda(), wsi.cuda(), b.cuda()),
           ref_fp8_block_linear(x, wb, wsi, b), dtype, (1, N), "gemv block")
    qw, sc = int4_weights(N, K, 128, dtype, gen)
    _check(gpu.int4_linear(x.cuda(), qw.cuda(), sc.cuda(), b.cuda()), ref_int4_linear(x, qw, sc, b), dtype,
           (1, N), "gemv int4")


@pytest.mark.parametrize("route", ["default", "gemv", "skinny"])
@pytest.mark.parametrize("M", [1, 32, 64, 200], ids=lambda m: f"M{m}")
def test_cuda_graph_replay(M, route, monkeypatch):
    """All three ops captured in one CUDA graph, replayed on new inputs, equal the eager results."""
    monkeypatch.setattr(triton_common, "GEMV", route == "gemv")
    monkeypatch.setattr(gpu, "SKINNY_DECODE", route == "skinny")
    K, N, dtype = 2048, 520, torch.bfloat16
    gen = _gen(M)
    w8, ws = (t.cuda() for t in fp8_weights(N, K, gen))
    wb, wsi = (t.cuda() for t in block_weights(N, K, gen))
    qw, sc = (t.cuda() for t in int4_weights(N, K, 128, dtype, gen))
    pre = pre_scales(K, dtype, gen).cuda()
    bias = torch.randn(N, generator=gen).to(dtype).cuda()
    s_in = torch.tensor(0.02, device="cuda")
    x = activations(M, K, dtype, "model", gen).cuda()

    def run():
        return (gpu.fp8_linear(x, w8, ws, s_in, bias), gpu.fp8_block_linear(x, wb, wsi, bias),
                gpu.int4_linear(x, qw, sc, bias, 128, pre))

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()  # compile and probe outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run()
    x.copy_(activations(M, K, dtype, "random", gen).cuda())
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(outs, run()):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
