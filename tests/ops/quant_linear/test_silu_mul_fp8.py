"""The FP8 down projection's x pass fused into silu * up (`silu_mul_fp8_linear`): the kernel's FP8
output and row scales are bit for bit fp8_linear's x pass (`quantize_tensor`) over the 16-bit
silu * up, the fused GEMM bit for bit the two ops one after the other, both against the float64
reference of the contract (fp8_linear of silu(gate) * up rounded to the dtype); where the fused path
is not ready (the CPU, decode rows, fp32) the op is the two ops. gate / up are the halves of one
[M, 2K] projection output (strided rows); outputs poisoned (triton_common.empty). Under
TRITON_INTERPRET=1 on a CPU (torch._scaled_mm has a CPU form); with a GPU, on it."""

from __future__ import annotations

import pytest
import torch

import gdn_export.ops.quant_linear as op
from gdn_export.ops import backends
from kernels.quant_linear import gpu
from kernels.quant_linear.triton import common as triton_common
from kernels.quant_linear.triton.fp8 import quantize_tensor
from kernels.silu_mul.triton.silu_mul import silu_mul_rows
from tests.ops.quant_linear.cases import TOL, fp8_weights, input_scale_for, nan_empty, ref_fp8_linear, rel_rms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = [(65, 96, 48), (130, 160, 64), (300, 2048, 512)]  # M > the skinny GEMM's 64 rows
IDS = ["M65-K96-N48", "M130-K160-N64", "M300-K2048-N512"]


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(triton_common, "empty", nan_empty)


def _inputs(M, K, N, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    both = (torch.randn(M, 2 * K, generator=gen) * 3).to(dtype).to(DEVICE)
    gate, up = both[:, :K], both[:, K:]
    w, ws = fp8_weights(N, K, gen, DEVICE)
    y16 = torch.nn.functional.silu(gate.float()).to(dtype).float() * up.float()
    # a scale that is a 16-bit value (as calibration's amax / 448 often is): quotients land next to
    # e4m3 rounding ties, where x * (1 / s) and the correctly rounded x / s part
    return gate, up, w, ws, input_scale_for(y16).to(dtype).float().to(DEVICE)


@pytest.mark.parametrize("M,K,N", SHAPES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fused_x_pass_is_quantize_tensor_of_silu_mul(M, K, N, dtype):
    gate, up, w, ws, s = _inputs(M, K, N, dtype, M + K)
    y16 = silu_mul_rows(gate, up, torch.empty(M, K, dtype=dtype, device=DEVICE))
    want_q, want_rs = quantize_tensor(y16, s)
    xq = nan_empty(M, K, dtype=torch.float8_e4m3fn, device=DEVICE)
    rs = nan_empty(M, 1, dtype=torch.float32, device=DEVICE)
    silu_mul_rows(gate, up, xq, s, rs)
    assert torch.equal(xq.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(rs, want_rs)
    # the fused GEMM: the same quantized x, the same call
    y = gpu.silu_mul_fp8_linear(gate, up, w, ws, s)
    want = torch._scaled_mm(want_q, w.t(), scale_a=want_rs, scale_b=ws.view(1, N), out_dtype=dtype)
    assert y.dtype == dtype and torch.equal(y, want)
    err = rel_rms(y.cpu(), ref_fp8_linear(y16.cpu(), w.cpu(), ws.cpu(), s.cpu()))
    assert err <= TOL[dtype], err


def test_the_op_is_the_two_ops_where_it_does_not_fuse(monkeypatch):
    """The CPU (no fused eager kernels), decode rows (the skinny GEMM quantizes in its tiles) and
    fp32: fp8_linear(silu_mul(gate, up)) exactly; readiness says why not."""
    from gdn_export.ops.silu_mul import silu_mul

    for M, dtype in ((130, torch.bfloat16), (3, torch.bfloat16), (130, torch.float32)):
        gate, up, w, ws, s = _inputs(M, 96, 48, dtype, M)
        got = op.silu_mul_fp8_linear(gate, up, w, ws, s)
        assert torch.equal(got, op.fp8_linear(silu_mul(gate, up), w, ws, s))
        if DEVICE == "cpu":
            assert not op.silu_mul_fp8_ready(gate, up, w)
    if DEVICE == "cuda":
        gate, up, w, _, _ = _inputs(3, 96, 48, torch.bfloat16, 0)
        assert not op.silu_mul_fp8_ready(gate, up, w)  # decode rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_mlp_takes_the_fused_path_for_an_fp8_down_projection(monkeypatch, dtype):
    """SwiGLUMLP with an Fp8Linear down_proj: the fused call where ready, the same output as the
    module's own two ops (bit for bit on a GPU, where both reach cuBLASLt with the same x; within the
    FP8 tolerance on the CPU, where the unfused fp8_linear is the fp32 reference), 3-D input."""
    from gdn_export.modules.mlp import SwiGLUMLP
    from gdn_export.modules.quant_linear import Fp8Linear

    gen = torch.Generator().manual_seed(1)
    H, I = 64, 96
    mlp = SwiGLUMLP(H, I).to(dtype)
    torch.nn.init.normal_(mlp.gate_proj.weight, std=0.2, generator=gen)
    torch.nn.init.normal_(mlp.up_proj.weight, std=0.2, generator=gen)
    down = Fp8Linear(I, H)
    down.weight, down.weight_scale = fp8_weights(H, I, gen)
    x = torch.randn(2, 70, H, generator=gen).to(dtype)
    with torch.no_grad():
        down.input_scale = input_scale_for(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    mlp.down_proj = down
    mlp = mlp.to(DEVICE)
    x = x.to(DEVICE)
    from gdn_export.ops.silu_mul import silu_mul

    monkeypatch.setattr(backends, "current_name", lambda: "triton")  # the fused eager kernels' backend
    if DEVICE == "cpu":  # their GPU-only gate and rowwise probe, opened here
        monkeypatch.setattr(backends, "on_gpu", lambda t: True)
        monkeypatch.setattr(op, "prequantized_ready", lambda *a: True)
    with torch.no_grad():
        want = mlp.down_proj(silu_mul(mlp.gate_proj(x), mlp.up_proj(x)))  # the same silu * up kernel
        calls = []
        real = gpu.silu_mul_fp8_linear
        monkeypatch.setattr(gpu, "silu_mul_fp8_linear", lambda *a, **k: calls.append(1) or real(*a, **k))
        got = mlp(x)
    assert calls == [1] and got.shape == want.shape and got.dtype == dtype
    if DEVICE == "cuda":
        assert torch.equal(got, want)
    else:
        assert rel_rms(got, want) <= TOL[dtype]
