"""The FP8 K/V cache of the attention layers: per-layer scales on the modules, the write and the read.

A model whose attention layers hold `kv_scales = (k_scale, v_scale)` (python floats, fp32-exact,
> 0; set by `set_kv_scales`, read from a checkpoint by gdn_export.weights.kv_scales) stores each
in-place cache as float8_e4m3fn [B, Hkv, L, D]:

    write   cache[b, :, slot] = e4m3(clamp(k / k_scale, +-448))     (k after k_norm and RoPE; v after v_proj)
    read    attention(q, cache_k * k_scale, cache_v * v_scale)       (dequantized in fp32, rounded to q's dtype)

(gdn_export.ops.attention.kv_fp8 has the ops). The recurrent GDN state keeps the layout's
state_dtype; conv states keep the model dtype. Only the in-place cache layout takes an FP8 cache.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gdn_export.errors import GdnExportError
from gdn_export.ops.attention import attention, decode_shaped, kv_cache_update, write_kv_cache_
from gdn_export.ops.attention.kv_fp8 import (FP8, attention_fp8, attention_fp8_at, kv_dequantize, kv_quantize,
                                             write_kv_cache_fp8_)
from gdn_export.ops.backends import exporting

KV_CACHE_FORMAT = "fp8"  # the one FP8 cache format: float8_e4m3fn, per-tensor static scales


def attention_layers(model: nn.Module) -> dict[int, nn.Module]:
    """{layer index: attention module} of a HybridForCausalLM (modules with a `kv_scales` slot)."""
    return {m.layer_idx: m for m in model.modules() if hasattr(m, "kv_scales") and hasattr(m, "layer_idx")}


def fp32_exact(x: float) -> float:
    """x rounded to the nearest fp32 (the scale PyTorch, Triton and the ONNX initializer all use)."""
    return float(torch.tensor(float(x), dtype=torch.float32))


def set_kv_scales(model: nn.Module, scales: dict[int, tuple[float, float]] | None) -> None:
    """Store the cache of every attention layer in FP8 with scales {layer: (k_scale, v_scale)} (every
    attention layer named, each scale finite and > 0), or in the model dtype again (None)."""
    layers = attention_layers(model)
    if scales is None:
        for m in layers.values():
            m.kv_scales = None
        return
    if not layers:
        raise GdnExportError("an FP8 K/V cache needs attention layers; this model has none")
    if set(scales) != set(layers):
        missing = sorted(set(layers) - set(scales)) or sorted(set(scales) - set(layers))
        raise GdnExportError(f"FP8 K/V cache scales name layers {sorted(scales)}, the model's attention "
                             f"layers are {sorted(layers)} (layer {missing[0]} differs)")
    layout = getattr(model, "layout", None)
    if layout is not None and not layout.inplace:
        raise GdnExportError("an FP8 K/V cache needs the in-place cache layout (export --kv-cache inplace); "
                             "the concat layout keeps the model dtype")
    for i, (ks, vs) in scales.items():
        for name, s in (("k_scale", ks), ("v_scale", vs)):
            if not (math.isfinite(float(s)) and float(s) > 0):
                raise GdnExportError(f"layer {i} {name} {s}: FP8 K/V cache scales must be finite and > 0")
        layers[i].kv_scales = (fp32_exact(ks), fp32_exact(vs))


def kv_scales(model: nn.Module) -> dict[int, tuple[float, float]] | None:
    """{layer: (k_scale, v_scale)} of an FP8-cache model, None for a model-dtype cache."""
    layers = attention_layers(model)
    got = {i: m.kv_scales for i, m in layers.items() if m.kv_scales is not None}
    return got or None


def kv_cache_dtype(model: nn.Module, default: torch.dtype) -> torch.dtype:
    """float8_e4m3fn for an FP8-cache model, else `default` (the model dtype). GdnExportError for an
    FP8 cache under the concat layout (which stores past K / V in the model dtype)."""
    if kv_scales(model) is None:
        return default
    layout = getattr(model, "layout", None)
    if layout is not None and not layout.inplace:
        raise GdnExportError("an FP8 K/V cache needs the in-place cache layout (export --kv-cache inplace); "
                             "the concat layout keeps K / V in the model dtype")
    return FP8


def write_and_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_cache: torch.Tensor,
                     value_cache: torch.Tensor, step, scaling: float, scales: tuple[float, float], kept):
    """One attention layer over its FP8 caches [B, Hkv, L, D]: q [B, H, T, D], new k / v [B, Hkv, T,
    D] (q's dtype) written at step.write_index, then attention. Returns (o [B, H, T, D] in q's
    dtype, key cache, value cache). `kept(cache, update, step)` is gated_attention's streaming rule
    (padded tokens write back the slot's old content). Exporting: QuantizeLinear -> TensorScatter ->
    DequantizeLinear -> Attention; eager / compiled: the fused fp8 write and attention_fp8."""
    ks, vs = scales
    if key_cache.dtype != FP8 or value_cache.dtype != FP8:
        raise GdnExportError(f"layer with an FP8 K/V cache got {key_cache.dtype} / {value_cache.dtype} caches "
                             f"(the model's state_specs say float8_e4m3fn)")
    if exporting():
        kq, vq = kept(key_cache, kv_quantize(k, ks), step), kept(value_cache, kv_quantize(v, vs), step)
        key = kv_cache_update(key_cache, kq, step.write_index)
        value = kv_cache_update(value_cache, vq, step.write_index)
        o = attention(q, kv_dequantize(key, ks, q.dtype), kv_dequantize(value, vs, q.dtype), step.attn_mask, scaling)
        return o, key, value
    if step.keep_old:
        kq, vq = kept(key_cache, kv_quantize(k, ks), step), kept(value_cache, kv_quantize(v, vs), step)
        write_kv_cache_(key_cache, value_cache, kq, vq, step.write_index)
    else:
        write_kv_cache_fp8_(key_cache, value_cache, k, v, step.write_index, ks, vs)
    if decode_shaped(q, key_cache):  # decode steps: the call's small mask, built once
        o = attention_fp8(q, key_cache, value_cache, step.attn_mask, scaling, ks, vs)
    else:  # prefill: the mask from positions inside the kernel (no [B, 1, T, L] tensor)
        o = attention_fp8_at(q, key_cache, value_cache, step.past_lengths, scaling, step.sinks, step.window, ks, vs)
    return o, key_cache, value_cache
