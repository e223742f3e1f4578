"""A layer's new keys and values written into its two static caches, in place, in one launch.

    key_cache, value_cache  [B, Hkv, L, D]   any dtype, any strides      written in place
    key, value              [B, Hkv, S, D]   any dtype, any strides      rounded to the caches' dtype
    write_indices           [B]              int32 / int64               row b's first slot
    cache[b, h, write_indices[b] + s] = new[b, h, s] for s < S; slots outside [0, L) are not written
    (the model's layout keeps every row inside its cache).
    k_scale, v_scale        float or None    FP8 caches (float8_e4m3fn): new / scale in fp32, clamped to
                                             +-448, cast (round to nearest even); gdn_export.ops.attention.kv_fp8

Why a kernel: under torch.compile an in-place `scatter_` on a graph input is functionalised into
an out-of-place scatter (the whole cache copied) and a copy back (the whole cache again): 1.5 ms of
a 5.2 ms batch-32 decode step of the 1.66B model at 4096 context on the H200. Eager,
the scatter costs three launches per cache (the slot index's arange and add, then the scatter). Here
each program copies one token's D values of one head for both caches; the slot comes from
write_indices, so there is no host synchronisation and the launch depends on shapes alone (CUDA
graphs, torch.compile behind the gdn::write_kv_cache_ custom op).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_utils import next_pow2


@triton.jit
def kv_cache_write_kernel(kc, vc, k, v, widx, Hkv, S, L, D,
                          s_kc_b, s_kc_h, s_kc_l, s_kc_d, s_vc_b, s_vc_h, s_vc_l, s_vc_d,
                          s_k_b, s_k_h, s_k_s, s_k_d, s_v_b, s_v_h, s_v_s, s_v_d,
                          k_scale, v_scale, BLOCK_D: tl.constexpr, QUANT: tl.constexpr):
    pid = tl.program_id(0)  # (b, h, s), s fastest: neighbouring programs write neighbouring slots
    s = pid % S
    h = (pid // S) % Hkv
    b = pid // (S * Hkv)
    slot = tl.load(widx + b).to(tl.int64) + s
    width = tl.where((slot >= 0) & (slot < L), D, 0)  # a slot outside the cache: nothing written
    offs = tl.arange(0, BLOCK_D)
    m = offs < width
    b64, h64, s64 = b.to(tl.int64), h.to(tl.int64), s.to(tl.int64)
    x = tl.load(k + b64 * s_k_b + h64 * s_k_h + s64 * s_k_s + offs * s_k_d, mask=m)
    if QUANT:  # FP8 cache: scale in fp32 and saturate to e4m3's finite range before the cast
        x = tl.clamp(tl.math.div_rn(x.to(tl.float32), k_scale), -448.0, 448.0)  # IEEE division, as torch
    tl.store(kc + b64 * s_kc_b + h64 * s_kc_h + slot * s_kc_l + offs * s_kc_d, x.to(kc.dtype.element_ty), mask=m)
    y = tl.load(v + b64 * s_v_b + h64 * s_v_h + s64 * s_v_s + offs * s_v_d, mask=m)
    if QUANT:
        y = tl.clamp(tl.math.div_rn(y.to(tl.float32), v_scale), -448.0, 448.0)
    tl.store(vc + b64 * s_vc_b + h64 * s_vc_h + slot * s_vc_l + offs * s_vc_d, y.to(vc.dtype.element_ty), mask=m)


def supports(key_cache: torch.Tensor, value_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             write_indices: torch.Tensor) -> bool:
    """Whether kv_cache_write_ takes these tensors (4-D caches and updates of matching B, Hkv, D on
    one device, int32 / int64 write_indices of [B]); the caller's fallback handles the rest."""
    if key_cache.dim() != 4 or key.dim() != 4 or value_cache.shape != key_cache.shape or value.shape != key.shape:
        return False
    B, Hkv, _, D = key_cache.shape
    return (key.shape[0] == B and key.shape[1] == Hkv and key.shape[3] == D
            and write_indices.shape == (B,) and write_indices.dtype in (torch.int32, torch.int64)
            and len({t.device for t in (key_cache, value_cache, key, value, write_indices)}) == 1)


def kv_cache_write_(key_cache: torch.Tensor, value_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    write_indices: torch.Tensor, k_scale: float | None = None, v_scale: float | None = None) -> None:
    """Write key / value [B, Hkv, S, D] into key_cache / value_cache [B, Hkv, L, D] at slots
    write_indices[b] + s (see the module docstring); float8_e4m3fn caches need k_scale and v_scale."""
    quant = k_scale is not None or v_scale is not None
    fp8 = key_cache.dtype == value_cache.dtype == torch.float8_e4m3fn
    if (quant and not (fp8 and k_scale is not None and v_scale is not None)) or \
            (fp8 and not quant and key.dtype != key_cache.dtype):
        raise ValueError(f"kv_cache_write_: {key_cache.dtype} / {value_cache.dtype} caches, {key.dtype} update, "
                         f"k_scale {k_scale}, v_scale {v_scale} (float8_e4m3fn caches take both scales, or an "
                         f"update already in float8_e4m3fn)")
    B, Hkv, L, D = key_cache.shape
    S = key.shape[2]
    if B * Hkv * S == 0:
        return
    kv_cache_write_kernel[(B * Hkv * S,)](
        key_cache, value_cache, key, value, write_indices, Hkv, S, L, D,
        *key_cache.stride(), *value_cache.stride(), *key.stride(), *value.stride(),
        float(k_scale or 1.0), float(v_scale or 1.0),
        BLOCK_D=next_pow2(D), QUANT=quant, num_warps=1 if D <= 128 else 2)
