"""The FP8 K/V cache: per-tensor static scales, quantized on write, dequantized on read.

A layer's cache stores K (after k_norm and RoPE) and V (after v_proj) as float8_e4m3fn with one fp32
scale each (`k_scale`, `v_scale` > 0, calibrated as amax / 448 by `gdn-export quantize --kv-cache fp8`):

    gdn::kv_quantize(x, scale) -> q          x [...] fp32 / fp16 / bf16 -> q [...] float8_e4m3fn
        q = e4m3(clamp(x.float() / scale, -448, 448))         (round to nearest even)
        ONNX: Cast(FLOAT) (16-bit x) -> QuantizeLinear(scale fp32 initializer, FLOAT8E4M3FN zero point)
    gdn::kv_dequantize(q, scale, dtype) -> x  q [...] float8_e4m3fn -> x [...] dtype
        x = (q.float() * scale).to(dtype)
        ONNX: DequantizeLinear(scale fp32) -> Cast(dtype) (16-bit dtype)
    gdn::write_kv_cache_fp8_(key_cache, value_cache, key, value, write_indices, k_scale, v_scale)
        write_kv_cache_ of kv_quantize(key, k_scale) / kv_quantize(value, v_scale) into the fp8
        caches [B, Hkv, L, D], in place. GPU (sm_89+, Triton): one launch that scales, clamps and
        casts (kernels.attention.triton.kv_cache_write); elsewhere quantize, then scatter_.
    gdn::attention_fp8(q, key, value, mask, scale, k_scale, v_scale) -> o
        gdn::attention(q, kv_dequantize(key, k_scale, q.dtype), kv_dequantize(value, v_scale, q.dtype),
        mask, scale): the cache [B, Hkv, L, D] float8_e4m3fn, q [B, H, S, D] fp32 / fp16 / bf16.
        GPU (sm_89+, Triton, 16-bit q): the decode / prefill kernels load the fp8 tiles and multiply
        by the scale in fp32 (the same K / V values, rounded to q's dtype, as the dequantized path);
        elsewhere the dequantized cache through gdn::attention.
    gdn::attention_fp8_at(q, key, value, past_lengths, scale, sinks, window, k_scale, v_scale) -> o
        attention_fp8 with the mask of positions (gdn::attention_at's form: the runtime's prefill,
        no [B, 1, S, L] mask): GPU (sm_89+, Triton, 16-bit q) the positional prefill kernel on the
        fp8 tiles (kernels.attention.triton.prefill_positions); elsewhere the mask is built and
        attention_fp8's body runs.

Export writes kv_quantize -> TensorScatter (kv_cache_update) -> kv_dequantize -> Attention: the
graph's cache inputs / outputs are FLOAT8E4M3FN (docs/quantization.md, "FP8 K/V cache"); attention_fp8 and
write_kv_cache_fp8_ are the eager / compiled runtime's forms and are never exported.
"""

from __future__ import annotations

import torch

from gdn_export.ops import backends
from gdn_export.ops.attention import _attention, _triton_kernel, write_cache_

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
QUANTIZE_OP = "gdn::kv_quantize"
DEQUANTIZE_OP = "gdn::kv_dequantize"
WRITE_OP = "gdn::write_kv_cache_fp8_"
ATTENTION_OP = "gdn::attention_fp8"
ATTENTION_AT_OP = "gdn::attention_fp8_at"
MIN_CAPABILITY = (8, 9)  # e4m3 conversions in hardware (Ada, Hopper and later)


def quantize_ref(x: torch.Tensor, scale: float) -> torch.Tensor:
    """fp32 reference of kv_quantize (module docstring)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def dequantize_ref(q: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """fp32 reference of kv_dequantize (module docstring)."""
    return (q.float() * scale).to(dtype)


@torch.library.custom_op(QUANTIZE_OP, mutates_args=())
def kv_quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x [...] float -> [...] float8_e4m3fn: e4m3(clamp(x / scale, +-448))."""
    return quantize_ref(x, scale)


@kv_quantize.register_fake
def _(x, scale):
    return torch.empty(x.shape, dtype=FP8, device=x.device)


@torch.library.custom_op(DEQUANTIZE_OP, mutates_args=())
def kv_dequantize(q: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """q [...] float8_e4m3fn -> [...] dtype: q * scale (fp32 product, rounded once to dtype)."""
    return dequantize_ref(q, scale, dtype)


@kv_dequantize.register_fake
def _(q, scale, dtype):
    return torch.empty(q.shape, dtype=dtype, device=q.device)


def _hardware_fp8(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.get_device_capability(t.device) >= MIN_CAPABILITY


def write_kv_cache_fp8_(key_cache: torch.Tensor, value_cache: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor, write_indices: torch.Tensor, k_scale: float, v_scale: float) -> None:
    """key / value [B, Hkv, S, D] (float) quantized with k_scale / v_scale into the float8_e4m3fn
    caches [B, Hkv, L, D] at slots write_indices [B] + s, in place."""
    if key_cache.dtype != FP8 or value_cache.dtype != FP8:
        raise ValueError(f"write_kv_cache_fp8_: caches must be float8_e4m3fn, got {key_cache.dtype} / "
                         f"{value_cache.dtype}")
    if backends.can_call_directly(key_cache, value_cache, key, value, write_indices):
        _write_fp8(key_cache, value_cache, key, value, write_indices, k_scale, v_scale)
    else:
        _write_fp8_op(key_cache, value_cache, key, value, write_indices, k_scale, v_scale)


def _write_fp8(key_cache, value_cache, key, value, write_indices, k_scale, v_scale):
    kernel = _triton_kernel("kv_cache_write") if _hardware_fp8(key_cache) else None
    if kernel is not None and kernel.supports(key_cache, value_cache, key, value, write_indices):
        kernel.kv_cache_write_(key_cache, value_cache, key, value, write_indices, k_scale=k_scale, v_scale=v_scale)
        return
    write_cache_(key_cache, quantize_ref(key, k_scale), write_indices)
    write_cache_(value_cache, quantize_ref(value, v_scale), write_indices)


@torch.library.custom_op(WRITE_OP, mutates_args=("key_cache", "value_cache"))
def _write_fp8_op(key_cache: torch.Tensor, value_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  write_indices: torch.Tensor, k_scale: float, v_scale: float) -> None:
    _write_fp8(key_cache, value_cache, key, value, write_indices, k_scale, v_scale)


@_write_fp8_op.register_fake
def _(key_cache, value_cache, key, value, write_indices, k_scale, v_scale):
    return None


def attention_fp8_ref(q, key, value, mask, scale: float, k_scale: float, v_scale: float) -> torch.Tensor:
    """gdn::attention over the dequantized cache (q's dtype): the reference of attention_fp8."""
    return _attention(q, dequantize_ref(key, k_scale, q.dtype), dequantize_ref(value, v_scale, q.dtype),
                      mask, scale)


def attention_fp8(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float,
                  k_scale: float, v_scale: float) -> torch.Tensor:
    """Masked GQA attention over an FP8 cache (module docstring): q [B, H, S, D], key / value
    [B, Hkv, L, D] float8_e4m3fn, mask [B, 1, S, L] bool -> o [B, H, S, D] in q's dtype
    (gdn::attention_fp8; eager calls skip the dispatcher)."""
    if backends.can_call_directly(q, key, value, mask):
        return _attention_fp8(q, key, value, mask, scale, k_scale, v_scale)
    return _attention_fp8_op(q, key, value, mask, scale, k_scale, v_scale)


@torch.library.custom_op(ATTENTION_OP, mutates_args=())
def _attention_fp8_op(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float,
                      k_scale: float, v_scale: float) -> torch.Tensor:
    return _attention_fp8(q, key, value, mask, scale, k_scale, v_scale)


def _attention_fp8(q, key, value, mask, scale, k_scale, v_scale):
    if q.dtype in (torch.float16, torch.bfloat16) and _hardware_fp8(q):
        from gdn_export.ops.attention import DECODE_MIN_SLOTS

        kernel = _triton_kernel("decode")
        if kernel is not None and key.shape[2] >= DECODE_MIN_SLOTS and kernel.supports(q, key, value, mask):
            return kernel.attention_decode(q, key, value, mask, scale, k_scale=k_scale, v_scale=v_scale)
        kernel = _triton_kernel("prefill")
        if kernel is not None and kernel.supports(q, key, value, mask):
            return kernel.attention_prefill(q, key, value, mask, scale, k_scale=k_scale, v_scale=v_scale)
    return attention_fp8_ref(q, key, value, mask, scale, k_scale, v_scale)


@_attention_fp8_op.register_fake
def _(q, key, value, mask, scale, k_scale, v_scale):
    return torch.empty_like(q)


def _attention_fp8_at(q, key, value, past_lengths, scale, sinks, window, k_scale, v_scale):
    if q.dtype in (torch.float16, torch.bfloat16) and _hardware_fp8(q):
        kernel = _triton_kernel("prefill_positions")
        if kernel is not None and kernel.supports(q, key, value, past_lengths):
            return kernel.attention_prefill_positions(q, key, value, past_lengths, scale, sinks, window,
                                                      k_scale=k_scale, v_scale=v_scale)
    from gdn_export.ops.attention.positions import visibility

    mask = visibility(past_lengths.to(torch.int64), q.shape[2], key.shape[2], sinks, window)
    return _attention_fp8(q, key, value, mask, scale, k_scale, v_scale)


@torch.library.custom_op(ATTENTION_AT_OP, mutates_args=())
def attention_fp8_at(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_lengths: torch.Tensor,
                     scale: float, sinks: int, window: int, k_scale: float, v_scale: float) -> torch.Tensor:
    """attention_fp8 with the mask of positions: q [B, H, S, D], key / value [B, Hkv, L, D]
    float8_e4m3fn (this call's tokens written), past_lengths [B] int64, the streaming layout (sinks,
    window; window 0: none) -> o [B, H, S, D] in q's dtype. Equals attention_fp8(q, key, value,
    visibility(past_lengths, S, L, sinks, window), scale, k_scale, v_scale)."""
    return _attention_fp8_at(q, key, value, past_lengths, scale, sinks, window, k_scale, v_scale)


@attention_fp8_at.register_fake
def _(q, key, value, past_lengths, scale, sinks, window, k_scale, v_scale):
    return torch.empty_like(q)
