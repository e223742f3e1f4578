"""Fast CUDA paths of the quantized linear ops, same names, signatures and semantics as the contract in
gdn_export/ops/quant_linear/__init__.py (which registers them as custom ops and dispatches CUDA
tensors here).

Every path is capturable in a CUDA graph: launch parameters, split factors and buffers depend on
shapes and dtypes only, never on data, and nothing synchronises with the host.

SKINNY_DECODE     (on) M <= 64 rows of every format go to the skinny GEMM of triton/skinny.py (weight
                  rows as the MMA's wide side, fp8 x fp8 MMAs, x quantized in the tile, AWQ's
                  pre_scale applied to x's tile, split K in one launch): in a 1.66B decode step at
                  M = 1 on the H100, 1.05 ms of FP8 skinny GEMMs where bf16 spends 1.38 ms on the
                  same projections (0.76x; the routes below: 0.78x of the kernel table's sum), INT4
                  0.75x of it (benchmarks/quant_gpu.sh, docs/perf/quantization.md).
fp8_linear        M <= 32 (decode) and N < 6144: Triton skinny GEMM of triton/fp8.py (x quantized per
                  tile, split K). Otherwise, with 16-bit x and K, N multiples of 16: x quantized by
                  one Triton pass, then torch._scaled_mm (cuBLASLt FP8, rowwise scales [M, 1] x
                  [1, N], fp32 accumulation); else the Triton GEMM.
fp8_block_linear  M <= 32: Triton skinny GEMM, per-token group-128 quantization in the tiles. Larger
                  M: one quantization pass, then torch._scaled_mm's blockwise form (1x128 activation
                  scales x 128x128 weight scales) where it runs (16-bit x, K and N multiples of 128),
                  else the Triton block-scaled fp8 x fp8 GEMM.
int4_linear       (x * pre_scale first where given: one Triton pass for 16-bit x above 32 rows)
                  M <= 32 or fp32 x: Triton W4A16 of
                  triton/int4.py, split K for M <= 32. Larger M with 16-bit x: W dequantized by one
                  Triton pass, then the 16-bit GEMM. group_size not a multiple of 32: dequantized in
                  fp32 and torch.matmul.
silu_mul_fp8_linear  prefill rows (> 64) of an FP8 down projection: x_q and its row scales written by
                  the silu * up kernel (kernels/silu_mul), then torch._scaled_mm as fp8_linear.
fp8_linear_quantized  the same GEMM for an x_q that the kernel producing x wrote beside its 16-bit
                  output (kernels/rms_norm: the decoder's norms, the GDN output norm;
                  kernels/output_gate: the gated attention's output before o_proj).
GEMV              (triton_common.GEMV, off) one-row x to the CUDA-core GEMV of triton/gemv.py.
The probes of torch._scaled_mm's forms run once, eagerly (a capture that meets no answer takes Triton).
"""

from __future__ import annotations

import torch

from kernels.quant_linear.triton import common as triton_common, gemv as triton_gemv, skinny as triton_skinny
from kernels.quant_linear.triton.common import SKINNY_M
from kernels.quant_linear.triton.fp8 import GROUP, fp8_gemm, quantize_groups, quantize_tensor
from kernels.quant_linear.triton.int4 import int4_dequant, int4_gemm, scale_columns, tile_k
from kernels.triton_utils import cdiv

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# (form, out dtype, bias, device) -> whether torch._scaled_mm's rowwise / blockwise form runs here and
# matches the fp32 product; probed once.
_SCALED_MM_OK: dict = {}
# Decode rows with N at least this take _scaled_mm rather than the Triton skinny GEMM: on the H200
# (torch 2.11, docs/perf/quant_linear.md) cuBLAS was faster at M = 1 and 32 for N = 6144 / 8192 / 12288
# with K = 2048 / 4096, slower for N <= 2048.
SCALED_MM_DECODE_MIN_N = 6144
# M <= triton_skinny.MAX_M rows to the skinny GEMM of triton/skinny.py (module docstring;
# benchmarks/quant_linear_bench.py times both routes in one run).
SKINNY_DECODE = True
# The rowwise prefill GEMM with cuBLASLt's fast accumulation (the FP8 MMAs' own accumulator, no
# periodic promotion to fp32): on the H100 (torch 2.11, 2026-12-07) a 1.66B prefill's FP8 GEMMs took
# 12.2 ms against 13.9 with promotion (0.66x of bf16's against 0.75x, quant_linear_bench.py's
# fp8_scaled_mm_fast column). Off until the GPU tests (test_fp8_prefill_fast_accum_gpu) and the
# end-to-end accuracy have run with it.
FP8_FAST_ACCUM = False


def _check_x(name: str, x: torch.Tensor, K: int) -> None:
    if x.dtype not in _FLOATS:
        raise ValueError(f"{name}: x must be fp32 / fp16 / bf16, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != K:
        raise ValueError(f"{name}: x {tuple(x.shape)} must end in K={K} (the weight's input size)")


def _check_bias(name: str, bias, N: int) -> None:
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"{name}: bias {tuple(bias.shape)} must be [{N}]")


def _rows(x: torch.Tensor, K: int) -> torch.Tensor:
    x2 = x.reshape(-1, K)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _bias_as(bias, dtype):
    return None if bias is None else _contig(bias.to(dtype))


def _scaled_mm_ok(out_dtype: torch.dtype, has_bias: bool, device: torch.device, blockwise: bool = False) -> bool:
    """Whether torch._scaled_mm takes this form on this GPU with this output dtype (and a bias) and agrees
    with the fp32 product: rowwise fp32 scales [M, 1] x [1, N], or blockwise 1x128 activations (scales
    [M, K/128], M-major) x 128x128 weights (scales [K/128, N/128]). Probed once per key on a 37 x 384 x 256
    case, outside CUDA-graph capture (a capture that finds no answer yet uses the Triton GEMM)."""
    key = (blockwise, out_dtype, has_bias, device.index)
    if key not in _SCALED_MM_OK:
        if torch.cuda.is_current_stream_capturing():
            return False
        ok = False
        try:
            M, K, N = 37, 384, 256
            gen = torch.Generator(device=device).manual_seed(0)
            a = torch.randn(M, K, device=device, generator=gen).to(torch.float8_e4m3fn)
            b = torch.randn(N, K, device=device, generator=gen).to(torch.float8_e4m3fn)
            bias = torch.randn(N, device=device, generator=gen).to(out_dtype) if has_bias else None
            if blockwise:
                sa = (torch.rand(K // 128, M, device=device, generator=gen) + 0.5).t()
                sb = torch.rand(N // 128, K // 128, device=device, generator=gen) + 0.5
                y = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb.t(), bias=bias, out_dtype=out_dtype)
                ref = ((a.float() * sa.repeat_interleave(128, 1)) @
                       (b.float() * sb.repeat_interleave(128, 0).repeat_interleave(128, 1)).t())
            else:
                sa = torch.rand(M, 1, device=device, generator=gen) + 0.5
                sb = torch.rand(1, N, device=device, generator=gen) + 0.5
                y = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=out_dtype)
                ref = (a.float() @ b.float().t()) * sa * sb
            if has_bias:
                ref = ref + bias.float()
            ok = y.dtype == out_dtype and ((y.float() - ref).norm() / ref.norm()).item() < 1e-2
        except (RuntimeError, TypeError, ValueError):
            ok = False
        _SCALED_MM_OK[key] = ok
    return _SCALED_MM_OK[key]


def _fp8_operands(weight, weight_scale, input_scale, bias, dtype):
    """(weight [N, K] contiguous, weight_scale as fp32 [N] contiguous, input_scale as an fp32 scalar,
    bias in dtype or None): fp8_linear's operands as its routes take them."""
    N = weight.shape[0]
    return (_contig(weight), _contig(weight_scale.float().reshape(N)), input_scale.float().reshape(()),
            _bias_as(bias, dtype))


def _rowwise_mm(xq, rs, weight, ws, bias, out_dtype):
    """cuBLASLt's FP8 GEMM, rowwise form: xq [M, K] e4m3 with row scales rs [M, 1], weight [N, K] e4m3
    with ws [N] (fp8_linear's prefill route, and silu_mul_fp8_linear's); fast accumulation per
    FP8_FAST_ACCUM."""
    return torch._scaled_mm(xq, weight.t(), scale_a=rs, scale_b=ws.view(1, -1), bias=bias, out_dtype=out_dtype,
                            use_fast_accum=FP8_FAST_ACCUM)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """Per-channel FP8 weights, static per-tensor FP8 activations (ModelOpt FP8).

    Args:
        x [..., K] fp32 / fp16 / bf16; weight [N, K] float8_e4m3fn; weight_scale [N] fp32;
        input_scale [] fp32; bias [N] or None.
    Returns:
        y [..., N] in x's dtype: (e4m3(clamp(x / input_scale)) @ weight^T) * input_scale * weight_scale + bias.
    """
    N, K = weight.shape
    _check_x("fp8_linear", x, K)
    _check_bias("fp8_linear", bias, N)
    x2 = _rows(x, K)
    M = x2.shape[0]
    weight, ws, s_in, b = _fp8_operands(weight, weight_scale, input_scale, bias, x.dtype)
    if M <= triton_skinny.MAX_M and SKINNY_DECODE:
        y = triton_skinny.skinny(triton_skinny.FP8_TENSOR, x2, weight, ws, s_in, b)
    elif M == 1 and triton_common.GEMV:
        y = triton_gemv.gemv(triton_gemv.FP8_TENSOR, x2, weight, ws, s_in, b)
    elif ((M > SKINNY_M or N >= SCALED_MM_DECODE_MIN_N) and x.dtype != torch.float32 and K % 16 == 0
            and N % 16 == 0 and x2.is_cuda and _scaled_mm_ok(x.dtype, b is not None, x2.device)):
        xq, rs = quantize_tensor(x2, s_in)
        y = _rowwise_mm(xq, rs, weight, ws, b, x.dtype)
    else:
        y = fp8_gemm(x2, weight, ws, s_in, b, blockwise=False)
    return y.view(*x.shape[:-1], N)


def prequantized_ready(M: int, K: int, N: int, dtype: torch.dtype, has_bias: bool, device: torch.device) -> bool:
    """Whether M rows of a 16-bit x [M, K] in dtype, quantized by the kernel that produced x (silu * up,
    an RMSNorm, the output gate), run through `fp8_linear_quantized` into an FP8 [N, K] projection: the rows fp8_linear
    sends to torch._scaled_mm (more than the skinny GEMM's, 16-bit x, K and N multiples of 16, the
    rowwise form probed on this GPU)."""
    return (M > triton_skinny.MAX_M and dtype in (torch.float16, torch.bfloat16) and K % 16 == 0 and N % 16 == 0
            and device.type == "cuda" and _scaled_mm_ok(dtype, has_bias, device))


def fp8_linear_quantized(xq: torch.Tensor, row_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                         input_scale: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """fp8_linear's prefill route from an x already quantized by the kernel that produced it: xq [M, K]
    float8_e4m3fn (e4m3(clamp(x / input_scale)) of the 16-bit x), row_scale [M, 1] fp32 (input_scale
    per row); weight [N, K] float8_e4m3fn, weight_scale [N], bias [N] or None. y [M, N] in out_dtype, bit
    for bit fp8_linear(x) on the rows `prequantized_ready` admits (the same cuBLASLt call)."""
    weight, ws, _, b = _fp8_operands(weight, weight_scale, input_scale, bias, out_dtype)
    return _rowwise_mm(xq, row_scale, weight, ws, b, out_dtype)


def silu_mul_fp8_linear(gate2: torch.Tensor, up2: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                        input_scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """fp8_linear(silu(gate2) * up2, ...) with the x pass inside the silu * up kernel: gate2, up2 [M, K]
    16-bit (unit stride along K); weight [N, K] float8_e4m3fn, weight_scale [N], input_scale [], bias
    [N] or None. y [M, N] in gate2's dtype, bit for bit the two ops one after the other (the same
    quantized x, the same cuBLASLt call). Callers check `prequantized_ready` first."""
    from kernels.silu_mul.triton.silu_mul import silu_mul_rows

    M, K = gate2.shape
    weight, ws, s_in, b = _fp8_operands(weight, weight_scale, input_scale, bias, gate2.dtype)
    xq = triton_common.empty(M, K, dtype=torch.float8_e4m3fn, device=gate2.device)
    rs = triton_common.empty(M, 1, dtype=torch.float32, device=gate2.device)
    silu_mul_rows(gate2, up2, xq, s_in, rs)
    return _rowwise_mm(xq, rs, weight, ws, b, gate2.dtype)


def fp8_block_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """Fine-grained FP8 (Qwen / DeepSeek published form): 128 x 128 weight blocks, dynamic per-token
    activation groups of 128.

    Args:
        x [..., K] fp32 / fp16 / bf16; weight [N, K] float8_e4m3fn;
        weight_scale_inv [ceil(N/128), ceil(K/128)] (fp32; bf16 is widened); bias [N] or None.
    Returns:
        y [..., N] in x's dtype (contract: sum over groups of the e4m3 products times both scales).
    """
    N, K = weight.shape
    _check_x("fp8_block_linear", x, K)
    _check_bias("fp8_block_linear", bias, N)
    if tuple(weight_scale_inv.shape) != (cdiv(N, GROUP), cdiv(K, GROUP)):
        raise ValueError(f"fp8_block_linear: weight_scale_inv {tuple(weight_scale_inv.shape)} must be "
                         f"[{cdiv(N, GROUP)}, {cdiv(K, GROUP)}] for weight [{N}, {K}]")
    x2 = _rows(x, K)
    M = x2.shape[0]
    weight, wsi, b = _contig(weight), _contig(weight_scale_inv.float()), _bias_as(bias, x.dtype)
    if M <= triton_skinny.MAX_M and SKINNY_DECODE:
        y = triton_skinny.skinny(triton_skinny.FP8_BLOCK, x2, weight, wsi, None, b)
    elif M == 1 and triton_common.GEMV:
        y = triton_gemv.gemv(triton_gemv.FP8_BLOCK, x2, weight, wsi, None, b)
    elif (M > SKINNY_M and x.dtype != torch.float32 and K % GROUP == 0 and N % GROUP == 0 and x2.is_cuda
            and _scaled_mm_ok(x.dtype, b is not None, x2.device, blockwise=True)):
        xq, xs = quantize_groups(x2)  # xs [M, K/128] M-major, as cuBLAS's 1x128 form takes it
        y = torch._scaled_mm(xq, weight.t(), scale_a=xs, scale_b=wsi.t(), bias=b, out_dtype=x.dtype)
    else:
        y = fp8_gemm(x2, weight, wsi, None, b, blockwise=True)
    return y.view(*x.shape[:-1], N)


def int4_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
                group_size: int = 128, pre_scale: torch.Tensor | None = None) -> torch.Tensor:
    """W4A16: int4 weights in groups of group_size along K, 16-bit (or fp32) activations.

    Args:
        x [..., K] fp32 / fp16 / bf16; qweight [N, ceil(K/2)] uint8 (low nibble even k, high odd k,
        two's complement); scales [N, ceil(K/group_size)] in x's dtype; bias [N] or None;
        pre_scale [K] (AWQ) or None: x is first multiplied by it, rounded to x's dtype.
    Returns:
        y [..., N] in x's dtype: x @ (int4 * scales[:, k // group_size])^T + bias, fp32 accumulation.
    """
    N, KH = qweight.shape
    K = x.shape[-1]
    _check_x("int4_linear", x, K)
    _check_bias("int4_linear", bias, N)
    if qweight.dtype != torch.uint8 or KH != cdiv(K, 2):
        raise ValueError(f"int4_linear: qweight {tuple(qweight.shape)} {qweight.dtype} must be uint8 [N, {cdiv(K, 2)}]")
    if group_size < 1 or tuple(scales.shape) != (N, cdiv(K, group_size)):
        raise ValueError(f"int4_linear: scales {tuple(scales.shape)} must be [{N}, {cdiv(K, max(group_size, 1))}] "
                         f"for group_size {group_size}")
    if pre_scale is not None and tuple(pre_scale.shape) != (K,):
        raise ValueError(f"int4_linear: pre_scale {tuple(pre_scale.shape)} must be [{K}]")
    x2 = _rows(x, K)
    b = _bias_as(bias, x.dtype)
    M = x2.shape[0]
    if M <= triton_skinny.MAX_M and group_size % 32 == 0 and SKINNY_DECODE:
        y = triton_skinny.skinny(triton_skinny.INT4, x2, _contig(qweight), _contig(scales.to(x.dtype)), None, b,
                                 group_size, None if pre_scale is None else _contig(pre_scale.to(x.dtype)))
        return y.view(*x.shape[:-1], N)
    if pre_scale is not None:
        if M > SKINNY_M and x.dtype != torch.float32:
            x2 = scale_columns(x2, _contig(pre_scale.to(x.dtype)))
        else:
            x2 = x2 * pre_scale.to(x.dtype)
    if M == 1 and triton_common.GEMV and group_size % 128 == 0:
        y = triton_gemv.gemv(triton_gemv.INT4, x2, _contig(qweight), _contig(scales.to(x.dtype)), None, b, group_size)
    elif tile_k(group_size) is None:
        y = _int4_dequant_matmul(x2, qweight, scales, b, group_size)
    elif M > SKINNY_M and x.dtype != torch.float32:
        # prefill: W dequantized to x's dtype by one Triton pass, then the 16-bit GEMM (cuBLAS); the
        # Triton W4A16 GEMM ran 3.8-4.7x bf16's time at M = 4096 on the H200 (docs/perf/quant_linear.md)
        w = int4_dequant(_contig(qweight), _contig(scales), K, group_size, x.dtype)
        y = torch.nn.functional.linear(x2, w, b)
    else:
        y = int4_gemm(x2, _contig(qweight), _contig(scales.to(x.dtype)), b, group_size)
    return y.view(*x.shape[:-1], N)


def _int4_dequant_matmul(x2, qweight, scales, bias, group_size):
    """Group sizes the Triton tiles cannot hold (not a multiple of 32): W dequantized in fp32, matmul in fp32."""
    K = x2.shape[1]
    b = qweight.to(torch.int16)
    lo, hi = b & 15, b >> 4
    lo, hi = lo - 16 * (lo >= 8), hi - 16 * (hi >= 8)
    q = torch.stack((lo, hi), dim=-1).reshape(qweight.shape[0], -1)[:, :K].float()
    w = q * scales.float().repeat_interleave(group_size, dim=1)[:, :K]
    y = x2.float() @ w.t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x2.dtype)
