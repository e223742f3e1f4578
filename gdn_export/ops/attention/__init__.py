"""The in-place K/V cache update and fused attention: two torch ops that export to standard ONNX.

    gdn::kv_cache_update(cache, update, write_indices) -> new_cache
        cache          [B, Hkv, L, D]   T    L = cache slots (static)
        update         [B, Hkv, S, D]   T    S new tokens per row (S <= L)
        write_indices  [B]              int64
        new_cache[b, :, write_indices[b] + s] = update[b, :, s]; every other slot is cache's.
        Rows must fit: write_indices[b] + S <= L (the model's layout guarantees it).
        ONNX: TensorScatter (opset 24, axis 2, mode "linear") -> TensorRT KV_CACHE_UPDATE, whose output
        is its input buffer updated in place.

    gdn::write_kv_cache_(key_cache, value_cache, key, value, write_indices) -> ()
        kv_cache_update of both caches, in place: the eager / compiled runner's form (never
        exported). On a GPU with Triton one launch writes both (kernels.attention.triton.kv_cache_write); as a
        mutating custom op, torch.compile keeps it in place where a functionalised scatter_ copied
        each whole cache twice per call. Elsewhere `write_cache_` (scatter_) on each.

    gdn::attention(q, key, value, mask, scale) -> o
        q      [B, H, S, D]    T     H = m * Hkv: query head h reads key/value head h // m
        key    [B, Hkv, L, D]  T
        value  [B, Hkv, L, D]  T
        mask   [B, 1, S, L]    bool  True where query s may read slot l
        o      [B, H, S, D]    T     softmax(scale * q key^T, masked) value, softmax in fp32
        ONNX: Attention (opset 23, 4-D inputs: GQA from the head counts) -> TensorRT IAttention.
        PyTorch, fp16 / bf16 on a GPU: the split-KV Triton kernel (kernels.attention.triton.decode)
        when the G * S query rows per kv head are few and the cache is long (decode steps), else
        the flash-attention Triton kernel (kernels.attention.triton.prefill: prefill, which visits
        only the cache tiles each query block may read), else (no Triton, shapes it does not take)
        SDPA's fused kernel; elsewhere SDPA in fp32. A query row that may read no slot gets zeros
        on every path (padded query rows of a ragged batch).

    gdn::attention_at(q, key, value, past_lengths, scale, sinks, window) -> o
        gdn::attention with the mask of positions (gdn_export.ops.attention.positions.visibility(
        past_lengths, S, L, sinks, window)) instead of a [B, 1, S, L] mask tensor: the runtime's
        form (never exported). fp16 / bf16 on a GPU: decode-shaped calls the split-KV kernel (their
        mask is small); prefill without streaming PyTorch's FlashAttention-2 (varlen, the cache
        read in place: gdn_export.ops.attention.flash) or the positional Triton kernel
        (kernels.attention.triton.prefill_positions), PREFILL_ROUTE says which; streaming the
        Triton kernel. Elsewhere the mask is built and gdn::attention's body runs.

These are not `gdn` domain nodes: TensorRT's parser and ONNX Runtime know them. They exist as torch
ops so that the exporter emits exactly these two nodes (instead of decomposing scaled dot product
attention), and so that the eager model can update the same cache tensors in place
(`write_cache_`), which a functional op cannot.
"""

from __future__ import annotations

import functools
import importlib

import torch
import torch.nn.functional as F

from gdn_export.ops import backends
# the decode kernel's limits without importing Triton (decode_shaped runs while torch.compile traces)
from kernels.attention.limits import max_rows as decode_max_rows

KV_UPDATE_OP = "gdn::kv_cache_update"
KV_WRITE_OP = "gdn::write_kv_cache_"
ATTENTION_OP = "gdn::attention"
ATTENTION_AT_OP = "gdn::attention_at"
SEQ_AXIS = 2  # of cache and update: [B, Hkv, L, D]
# Shortest cache for the split-KV decode kernel: below it SDPA's few blocks already finish quickly
# and the kernel's second (combine) launch is not paid back.
DECODE_MIN_SLOTS = 256
# Largest mask (elements) the SDPA route repeats over a group's G query heads to make one call.
REPEATED_MASK_MAX = 2**24
# gdn::attention_at's prefill without streaming: "flash" (PyTorch's FlashAttention-2 where it takes
# the shapes, gdn_export.ops.attention.flash) or "triton" (kernels.attention.triton.prefill_positions).
# benchmarks/long_context.py times both on the model's shapes (docs/perf/long_context.md).
PREFILL_ROUTE = "triton"


def slot_index(cache: torch.Tensor, update: torch.Tensor, write_indices: torch.Tensor) -> torch.Tensor:
    """[B, Hkv, S, D] int64 slot of every update element along the sequence axis."""
    B, Hkv, S, D = update.shape
    slots = write_indices.to(torch.int64)[:, None] + torch.arange(S, device=update.device)
    return slots[:, None, :, None].expand(B, Hkv, S, D)


def write_cache_(cache: torch.Tensor, update: torch.Tensor, write_indices: torch.Tensor) -> torch.Tensor:
    """The eager in-place form of kv_cache_update: writes `update` into `cache` and returns it (an
    FP8 cache takes an update already quantized: gdn_export.ops.attention.kv_fp8)."""
    if cache.dtype == torch.float8_e4m3fn:  # no CPU scatter kernel for float8: scatter the bytes
        cache.view(torch.uint8).scatter_(SEQ_AXIS, slot_index(cache, update, write_indices),
                                         update.to(cache.dtype).view(torch.uint8))
        return cache
    return cache.scatter_(SEQ_AXIS, slot_index(cache, update, write_indices), update.to(cache.dtype))


@torch.library.custom_op(KV_UPDATE_OP, mutates_args=())
def kv_cache_update(cache: torch.Tensor, update: torch.Tensor, write_indices: torch.Tensor) -> torch.Tensor:
    """Functional twin of `write_cache_` (a new tensor): what the ONNX graph computes."""
    return write_cache_(cache.clone(), update, write_indices)


@kv_cache_update.register_fake
def _(cache, update, write_indices):
    return torch.empty_like(cache)


def write_kv_cache_(key_cache: torch.Tensor, value_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    write_indices: torch.Tensor) -> None:
    """kv_cache_update of key_cache and value_cache [B, Hkv, L, D] with key / value [B, Hkv, S, D]
    at slots write_indices [B] + s, in place (gdn::write_kv_cache_; eager calls skip the dispatcher)."""
    if backends.can_call_directly(key_cache, value_cache, key, value, write_indices):
        _write_kv_cache(key_cache, value_cache, key, value, write_indices)
    else:
        _write_kv_cache_op(key_cache, value_cache, key, value, write_indices)


def _write_kv_cache(key_cache, value_cache, key, value, write_indices):
    kernel = _triton_kernel("kv_cache_write") if key_cache.is_cuda else None
    if kernel is not None and kernel.supports(key_cache, value_cache, key, value, write_indices):
        kernel.kv_cache_write_(key_cache, value_cache, key, value, write_indices)
        return
    write_cache_(key_cache, key, write_indices)
    write_cache_(value_cache, value, write_indices)


@torch.library.custom_op(KV_WRITE_OP, mutates_args=("key_cache", "value_cache"))
def _write_kv_cache_op(key_cache: torch.Tensor, value_cache: torch.Tensor, key: torch.Tensor,
                       value: torch.Tensor, write_indices: torch.Tensor) -> None:
    _write_kv_cache(key_cache, value_cache, key, value, write_indices)


@_write_kv_cache_op.register_fake
def _(key_cache, value_cache, key, value, write_indices):
    return None


def _attention(q, key, value, mask, scale):
    H, Hkv = q.shape[1], key.shape[1]
    dtype = q.dtype
    if q.is_cuda and dtype in (torch.float16, torch.bfloat16):
        return _attention_cuda(q, key, value, mask, scale)
    # fp32 scores and softmax, as TensorRT's fused kernels and ONNX Runtime's CPU kernel do for half
    # inputs; the result is rounded once.
    o = F.scaled_dot_product_attention(q.float(), key.float(), value.float(), attn_mask=mask,
                                       scale=scale, enable_gqa=H != Hkv)
    return o.masked_fill(~mask.any(-1, keepdim=True), 0).to(dtype)


@functools.cache
def _triton_kernel(name: str):
    """kernels.attention.triton.<name> (kv_cache_write, decode, prefill), or None where
    Triton is not installed (an optional extra)."""
    try:
        return importlib.import_module(f"kernels.attention.triton.{name}")
    except ImportError:
        return None


def _attention_cuda(q, key, value, mask, scale):
    """Half-precision inputs on a GPU. Decode steps (few query rows per kv head, a long cache) take
    the split-KV Triton kernel: SDPA would run only B * Hkv thread blocks over the whole cache
    there (2 for one sequence of the 1.66B model). Everything else it supports (prefill) takes the
    flash-attention Triton kernel, which skips the cache tiles no query of a block may read (the
    masked half of a causal prefill, the unwritten slots past a short context), where SDPA's
    memory-efficient kernel computes the whole S x L rectangle under a dense mask (9.4 ms of a
    4096-token prefill of the 1.66B model on an H200). SDPA remains for the rest. The choice
    depends on shapes alone, so a CUDA graph or torch.compile sees one path per shape."""
    kernel = _triton_kernel("decode")
    if kernel is not None and key.shape[2] >= DECODE_MIN_SLOTS and kernel.supports(q, key, value, mask):
        return kernel.attention_decode(q, key, value, mask, scale)
    kernel = _triton_kernel("prefill")
    if kernel is not None and kernel.supports(q, key, value, mask):
        return kernel.attention_prefill(q, key, value, mask, scale)
    return _attention_sdpa(q, key, value, mask, scale)


def _attention_sdpa(q, key, value, mask, scale):
    """SDPA's fused kernel on the stored dtype (fp32 scores and softmax inside the kernel, as
    TensorRT's fused attention), without fp32 copies of the whole cache, which cost more than the
    attention itself at batch 32, and without K/V repeats or enable_gqa (which the memory-efficient
    kernel lacks). Small calls (decode steps on short caches): the G = H / Hkv query heads of a kv
    head become G x S query rows of that head, the mask repeated G times: one launch. Large ones
    (prefill): one call per query head of each group (heads g, G + g, ... against kv heads 0, 1,
    ...) with one additive [B, 1, S, L] mask shared by the calls, because the repeated mask, which
    SDPA then converts to a bias, took ~400 MB for one 4096-token prefill of the 1.66B model (G = 8)."""
    B, H, S, D = q.shape
    Hkv, L = key.shape[1], key.shape[2]
    G = H // Hkv
    m = mask.expand(B, 1, S, L)
    # A query row that may read no slot is zeros by the op's contract (the Triton kernels write them);
    # SDPA on CUDA does not give them (bf16 / fp16, repeated boolean mask, torch 2.11, H200).
    reads_nothing = ~m.any(-1, keepdim=True)  # [B, 1, S, 1]
    if G == 1 or B * G * S * L <= REPEATED_MASK_MAX:
        if G > 1:
            m = m[:, :, None].expand(B, 1, G, S, L).reshape(B, 1, G * S, L)
        o = F.scaled_dot_product_attention(q.reshape(B, Hkv, G * S, D), key, value, attn_mask=m, scale=scale)
        return o.reshape(B, H, S, D).masked_fill(reads_nothing, 0)
    bias = torch.zeros((B, 1, S, L), dtype=q.dtype, device=q.device).masked_fill_(~m, float("-inf"))
    o = [F.scaled_dot_product_attention(q[:, g::G].contiguous(), key, value, attn_mask=bias, scale=scale)
         for g in range(G)]
    # [B, Hkv, G, S, D]: head h = kv head * G + g
    return torch.stack(o, 2).reshape(B, H, S, D).masked_fill(reads_nothing, 0)


@torch.library.custom_op(ATTENTION_OP, mutates_args=())
def attention(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
              scale: float) -> torch.Tensor:
    """Masked GQA attention (see the module docstring for shapes)."""
    return _attention(q, key, value, mask, scale)


@attention.register_fake
def _(q, key, value, mask, scale):
    return torch.empty_like(q)


def decode_shaped(q: torch.Tensor, key: torch.Tensor) -> bool:
    """Few query rows per kv head against a long cache (decode steps, short speculative calls): the
    calls the split-KV decode kernel takes, whose [B, 1, S, L] mask is small (shapes alone; the model
    passes them its shared mask)."""
    B, H, S, D = q.shape
    Hkv, L = key.shape[1], key.shape[2]
    return (L >= DECODE_MIN_SLOTS and 16 <= D <= 256 and not D & (D - 1) and Hkv > 0 and H % Hkv == 0
            and (H // Hkv) * S <= decode_max_rows(D))


def prefill_route(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_lengths: torch.Tensor,
                  window: int) -> str:
    """Which path gdn::attention_at takes for these inputs: "decode" (the split-KV kernel on the
    built mask), "flash", "triton" (positional prefill kernel) or "mask" (the mask built, then
    gdn::attention's body). Shapes, dtypes and devices alone decide."""
    if not (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and key.dtype == q.dtype):
        return "mask"
    if decode_shaped(q, key):
        return "decode"
    if PREFILL_ROUTE == "flash":
        from gdn_export.ops.attention import flash

        if flash.takes(q, key, value, window):
            return "flash"
    kernel = _triton_kernel("prefill_positions")
    if kernel is not None and kernel.supports(q, key, value, past_lengths):
        return "triton"
    return "mask"


def _attention_at(q, key, value, past_lengths, scale, sinks, window):
    route = prefill_route(q, key, value, past_lengths, window)
    if route == "flash":
        from gdn_export.ops.attention.flash import flash_prefill

        return flash_prefill(q, key, value, past_lengths, scale)
    if route == "triton":
        return _triton_kernel("prefill_positions").attention_prefill_positions(
            q, key, value, past_lengths, scale, sinks, window)
    from gdn_export.ops.attention.positions import visibility

    mask = visibility(past_lengths.to(torch.int64), q.shape[2], key.shape[2], sinks, window)
    return _attention(q, key, value, mask, scale)


@torch.library.custom_op(ATTENTION_AT_OP, mutates_args=())
def attention_at(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_lengths: torch.Tensor,
                 scale: float, sinks: int, window: int) -> torch.Tensor:
    """Causal (or streaming) GQA attention of S new tokens per row over the in-place cache: q [B, H,
    S, D], key / value [B, Hkv, L, D] (this call's tokens written), past_lengths [B] int64, the
    streaming layout (sinks, window; window 0: none) -> o [B, H, S, D] in q's dtype (module
    docstring). Equals attention(q, key, value, visibility(past_lengths, S, L, sinks, window), scale)."""
    return _attention_at(q, key, value, past_lengths, scale, sinks, window)


@attention_at.register_fake
def _(q, key, value, past_lengths, scale, sinks, window):
    return torch.empty_like(q)
