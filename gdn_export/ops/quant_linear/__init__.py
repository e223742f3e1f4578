"""Quantized linear layers as `gdn` custom ops: the contract shared by the reference, the GPU kernels
and the ONNX translation.

    fp8_linear(x, weight, weight_scale, input_scale, bias=None)          gdn::fp8_linear
        FP8 E4M3 weights per output channel, static (calibrated) per-tensor FP8 activations (the
        ModelOpt FP8 form). weight float8_e4m3fn [N, K]; weight_scale fp32 [N]; input_scale fp32 [].
        x_q = e4m3(clamp(x / input_scale, -448, 448));  y = (x_q @ weight.T) * input_scale * weight_scale + bias

    fp8_block_linear(x, weight, weight_scale_inv, bias=None)             gdn::fp8_block_linear
        Published fine-grained FP8 (Qwen / DeepSeek). weight float8_e4m3fn [N, K]; weight_scale_inv
        fp32 [ceil(N/128), ceil(K/128)]; W[n, k] = weight[n, k] * weight_scale_inv[n // 128, k // 128].
        Activations quantized at run time per token in groups of 128 along K:
        s[m, g] = max(amax|x[m, group g]|, 1e-10) / 448;  x_q = e4m3(x / s).

    int4_linear(x, qweight, scales, bias=None, group_size=128, pre_scale=None)   gdn::int4_linear
        W4A16 (AWQ / RTN). qweight uint8 [N, ceil(K/2)]: element (n, k) at byte k // 2, low nibble for
        even k, signed two's complement in [-8, 7] (ONNX INT4 packing); scales [N, ceil(K/group_size)]
        in x's dtype (fp32 for fp32 x); W[n, k] = int4(n, k) * scales[n, k // group_size].
        pre_scale [K] in x's dtype (AWQ's per-input-channel scale) or None: x is replaced by
        x * pre_scale rounded to x's dtype (the product a separate 16-bit multiply gives), so a
        kernel can apply it while it reads x.

    silu_mul_fp8_linear(gate, up, weight, weight_scale, input_scale, bias=None)
        fp8_linear(silu_mul(gate, up), ...) (an FP8 MLP's down projection): at prefill rows on a GPU
        the silu * up kernel writes x_q itself; everywhere else the two ops. Not a graph node.

    fp8_linear_quantized(x, xq, row_scale, weight, weight_scale, input_scale, bias=None)
        fp8_linear(x, ...) from an x_q that the kernel producing x wrote beside it (an RMSNorm:
        gdn_export.ops.rms_norm.rms_norm_quantized; the output gate:
        gdn_export.ops.output_gate.output_gate_quantized): the GPU's prefill GEMM without the x pass, bit
        for bit fp8_linear where `prequantized_ready`. Not a graph node. `offer_quantized` /
        `take_quantized` hand such an x_q from the norm to the Fp8Linear that reads x, through the
        sibling-projection group in between (gdn_export.modules.quant_fusion).

x [..., K] fp32 / fp16 / bf16; y [..., N] in x's dtype; bias [N] or None; accumulation in fp32.

Dispatch: CUDA tensors go to kernels.quant_linear.gpu.<same name> when that module imports,
everything else to the fp32 references in `naive.py`. Each op is one node for torch.compile, CUDA
graphs and torch.export (its fake impl gives the output shape); the ONNX translation (`onnx.py`)
writes standard QuantizeLinear / DequantizeLinear + MatMul.

Tolerances of a fast path against the reference (relative RMS of y): 1e-5 for fp32 x, 1e-2 for
fp16 / bf16 x.
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch

from gdn_export.ops import backends
from gdn_export.ops.quant_linear import naive

FP8 = torch.float8_e4m3fn
BLOCK = naive.BLOCK
FP8_MAX = naive.FP8_MAX
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_GPU: list = []  # [module or None] once looked up


def _gpu():
    if not _GPU:
        try:
            _GPU.append(importlib.import_module("kernels.quant_linear.gpu"))
        except ImportError:
            _GPU.append(None)
    return _GPU[0]


def _impl(device: torch.device, name: str):
    """gpu.<name> for CUDA tensors when gpu.py imports, else naive.<name>."""
    if device.type == "cuda":
        gpu = _gpu()
        if gpu is not None and hasattr(gpu, name):
            return getattr(gpu, name)
    return getattr(naive, name)


def _check_x(x: torch.Tensor, K: int, bias: torch.Tensor | None, N: int) -> None:
    if x.dtype not in _FLOATS:
        raise ValueError(f"x must be fp32, fp16 or bf16, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != K:
        raise ValueError(f"x must be [..., K={K}], got {tuple(x.shape)}")
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"bias must be [N={N}], got {tuple(bias.shape)}")


def check_fp8(x, weight, weight_scale, input_scale, bias=None) -> None:
    """ValueError naming the argument that breaks fp8_linear's contract."""
    if weight.dtype != FP8 or weight.dim() != 2:
        raise ValueError(f"weight must be float8_e4m3fn [N, K], got {weight.dtype} {tuple(weight.shape)}")
    N, K = weight.shape
    if weight_scale.dtype != torch.float32 or tuple(weight_scale.shape) != (N,):
        raise ValueError(f"weight_scale must be fp32 [N={N}], got {weight_scale.dtype} {tuple(weight_scale.shape)}")
    if input_scale.dtype != torch.float32 or input_scale.dim() != 0:
        raise ValueError(f"input_scale must be a 0-d fp32 tensor, got {input_scale.dtype} {tuple(input_scale.shape)}")
    _check_x(x, K, bias, N)


def check_fp8_block(x, weight, weight_scale_inv, bias=None) -> None:
    """ValueError naming the argument that breaks fp8_block_linear's contract."""
    if weight.dtype != FP8 or weight.dim() != 2:
        raise ValueError(f"weight must be float8_e4m3fn [N, K], got {weight.dtype} {tuple(weight.shape)}")
    N, K = weight.shape
    want = (-(-N // BLOCK), -(-K // BLOCK))
    if weight_scale_inv.dtype != torch.float32 or tuple(weight_scale_inv.shape) != want:
        raise ValueError(f"weight_scale_inv must be fp32 {want}, got {weight_scale_inv.dtype} "
                         f"{tuple(weight_scale_inv.shape)}")
    _check_x(x, K, bias, N)


def check_int4(x, qweight, scales, bias=None, group_size: int = 128, pre_scale=None) -> None:
    """ValueError naming the argument that breaks int4_linear's contract."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2 or group_size % 2:
        raise ValueError(f"group_size must be an even int >= 2, got {group_size!r}")
    if qweight.dtype != torch.uint8 or qweight.dim() != 2:
        raise ValueError(f"qweight must be uint8 [N, ceil(K/2)], got {qweight.dtype} {tuple(qweight.shape)}")
    N = qweight.shape[0]
    K = x.shape[-1] if x.dim() else 0
    if qweight.shape[1] != -(-K // 2):
        raise ValueError(f"qweight must be [N, ceil(K/2)={-(-K // 2)}] for x [..., K={K}], got {tuple(qweight.shape)}")
    want = (N, -(-K // group_size))
    scale_dtype = x.dtype
    if tuple(scales.shape) != want or scales.dtype != scale_dtype:
        raise ValueError(f"scales must be {scale_dtype} {want}, got {scales.dtype} {tuple(scales.shape)}")
    if pre_scale is not None and (tuple(pre_scale.shape) != (K,) or pre_scale.dtype != x.dtype):
        raise ValueError(f"pre_scale must be {x.dtype} [K={K}], got {pre_scale.dtype} {tuple(pre_scale.shape)}")
    _check_x(x, K, bias, N)


# ------------------------------------------------------------------------ torch.library ops
@torch.library.custom_op("gdn::fp8_linear", mutates_args=())
def _fp8_linear_op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   input_scale: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return _impl(x.device, "fp8_linear")(x, weight, weight_scale, input_scale, bias)


@_fp8_linear_op.register_fake
def _(x, weight, weight_scale, input_scale, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("gdn::fp8_block_linear", mutates_args=())
def _fp8_block_linear_op(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                         bias: Optional[torch.Tensor]) -> torch.Tensor:
    return _impl(x.device, "fp8_block_linear")(x, weight, weight_scale_inv, bias)


@_fp8_block_linear_op.register_fake
def _(x, weight, weight_scale_inv, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("gdn::int4_linear", mutates_args=())
def _int4_linear_op(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                    bias: Optional[torch.Tensor], group_size: int,
                    pre_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    return _impl(x.device, "int4_linear")(x, qweight, scales, bias, group_size, pre_scale)


@_int4_linear_op.register_fake
def _(x, qweight, scales, bias, group_size, pre_scale=None):
    return x.new_empty((*x.shape[:-1], qweight.shape[0]))


# ------------------------------------------------------------------------ public entries
def fp8_linear(x, weight, weight_scale, input_scale, bias=None) -> torch.Tensor:
    """x [..., K] -> y [..., N] in x's dtype (see module docstring)."""
    if backends.can_call_directly(x, weight, weight_scale, input_scale, bias):
        check_fp8(x, weight, weight_scale, input_scale, bias)
        return _impl(x.device, "fp8_linear")(x, weight, weight_scale, input_scale, bias)
    return torch.ops.gdn.fp8_linear(x, weight, weight_scale, input_scale, bias)


def fp8_block_linear(x, weight, weight_scale_inv, bias=None) -> torch.Tensor:
    """x [..., K] -> y [..., N] in x's dtype (see module docstring)."""
    if backends.can_call_directly(x, weight, weight_scale_inv, bias):
        check_fp8_block(x, weight, weight_scale_inv, bias)
        return _impl(x.device, "fp8_block_linear")(x, weight, weight_scale_inv, bias)
    return torch.ops.gdn.fp8_block_linear(x, weight, weight_scale_inv, bias)


def int4_linear(x, qweight, scales, bias=None, group_size: int = 128, pre_scale=None) -> torch.Tensor:
    """x [..., K] -> y [..., N] in x's dtype (see module docstring)."""
    if backends.can_call_directly(x, qweight, scales, bias, pre_scale):
        check_int4(x, qweight, scales, bias, group_size, pre_scale)
        return _impl(x.device, "int4_linear")(x, qweight, scales, bias, group_size, pre_scale)
    if pre_scale is None:  # the op's original arity: graphs and exports without AWQ keep their form
        return torch.ops.gdn.int4_linear(x, qweight, scales, bias, int(group_size))
    return torch.ops.gdn.int4_linear(x, qweight, scales, bias, int(group_size), pre_scale)


def silu_mul_fp8_ready(gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor, bias=None) -> bool:
    """Whether `silu_mul_fp8_linear` fuses: silu * up's fused kernel runs for gate / up
    (gdn_export.ops.silu_mul.fused_ready: eager, on a GPU), an FP8 weight [N, K] with K gate's last
    dim, and the rows are ones fp8_linear sends to torch._scaled_mm (`prequantized_ready`)."""
    from gdn_export.ops import silu_mul

    if not silu_mul.fused_ready(gate, up) or weight.dim() != 2 or gate.shape[-1] != weight.shape[1]:
        return False
    return prequantized_ready(gate, weight, bias)


def silu_mul_fp8_linear_fused(gate, up, weight, weight_scale, input_scale, bias=None) -> torch.Tensor:
    """The fused form alone (callers check `silu_mul_fp8_ready` first): gate, up [..., K] -> y [..., N]
    in gate's dtype, the silu * up kernel writing x_q and its row scales for cuBLASLt's FP8 GEMM."""
    from gdn_export.ops import glue

    check_fp8(gate, weight, weight_scale, input_scale, bias)
    y = _gpu().silu_mul_fp8_linear(glue.rows(gate), glue.rows(up), weight, weight_scale, input_scale, bias)
    return y.view(*gate.shape[:-1], weight.shape[0])


def silu_mul_fp8_linear(gate, up, weight, weight_scale, input_scale, bias=None) -> torch.Tensor:
    """fp8_linear(silu_mul(gate, up), weight, weight_scale, input_scale, bias): gate, up [..., K] ->
    y [..., N] in gate's dtype. Where `silu_mul_fp8_ready`, one kernel writes the product already
    quantized (FP8 x and its row scales) for cuBLASLt's FP8 GEMM, which then reads 1 byte an element
    where the two ops write and read y in 16 bits and read it again to quantize it; the same bits.
    Elsewhere the two ops."""
    from gdn_export.ops import silu_mul

    if silu_mul_fp8_ready(gate, up, weight, bias):
        return silu_mul_fp8_linear_fused(gate, up, weight, weight_scale, input_scale, bias)
    return fp8_linear(silu_mul.silu_mul(gate, up), weight, weight_scale, input_scale, bias)


def prequantized_ready(x: torch.Tensor, weight: torch.Tensor, bias=None) -> bool:
    """Whether an x that its producing kernel quantizes itself (eager, on a GPU) runs through
    `fp8_linear_quantized` into the FP8 weight [N, K], x's elements read as [M, K] rows (x [..., K], or
    [..., H, D] with H D = K): rows fp8_linear sends to cuBLASLt's FP8 GEMM
    (kernels.quant_linear.gpu.prequantized_ready). False under tracing and compilation."""
    if torch.compiler.is_compiling() or weight.dtype != FP8 or weight.dim() != 2 or not x.is_cuda:
        return False
    gpu = _gpu()
    N, K = weight.shape
    if gpu is None or x.dim() < 1 or K == 0 or x.numel() % K or K % x.shape[-1]:
        return False
    return gpu.prequantized_ready(x.numel() // K, K, N, x.dtype, bias is not None, x.device)


def fp8_linear_quantized(x, xq, row_scale, weight, weight_scale, input_scale, bias=None) -> torch.Tensor:
    """fp8_linear(x, weight, weight_scale, input_scale, bias) from xq = e4m3(clamp(x / input_scale))
    [..., K] float8_e4m3fn (x's layout) and row_scale [M, 1] fp32 (input_scale per row of x's M = numel / K
    rows), written by the kernel that produced x: y [..., N] in x's dtype (callers check
    `prequantized_ready` first)."""
    from gdn_export.ops import glue

    check_fp8(x, weight, weight_scale, input_scale, bias)
    y = _gpu().fp8_linear_quantized(glue.rows(xq), row_scale, weight, weight_scale, input_scale, bias, x.dtype)
    return y.view(*x.shape[:-1], weight.shape[0])


# One x_q on offer: (x, xq, row_scale, input_scale). The norm that wrote x and xq offers them for the
# FP8 projection whose input_scale (that tensor object) quantized xq; that projection's forward takes
# them when it is called on x itself (the same tensor object), once. A later offer replaces an
# earlier one that nobody took.
_OFFER: list = []


def offer_quantized(x: torch.Tensor, xq: torch.Tensor, row_scale: torch.Tensor, input_scale: torch.Tensor) -> None:
    """Offer xq / row_scale (`fp8_linear_quantized`'s) as x's quantization under input_scale."""
    _OFFER[:] = [(x, xq, row_scale, input_scale)]


def take_quantized(x: torch.Tensor, input_scale: torch.Tensor):
    """(xq, row_scale) offered for exactly this x and input_scale (the same tensor objects), else None;
    the offer is gone either way once x is the offered tensor."""
    if not _OFFER or torch.compiler.is_compiling():
        return None
    ox, xq, rs, scale = _OFFER[0]
    if ox is not x:
        return None
    _OFFER.clear()
    return (xq, rs) if scale is input_scale else None


__all__ = ["fp8_linear", "fp8_block_linear", "int4_linear", "silu_mul_fp8_linear", "silu_mul_fp8_linear_fused",
           "silu_mul_fp8_ready", "prequantized_ready", "fp8_linear_quantized", "offer_quantized", "take_quantized",
           "check_fp8", "check_fp8_block", "check_int4"]
