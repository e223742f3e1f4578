"""The attention prefill through PyTorch's FlashAttention-2 kernels (varlen form), without a mask.

    q             [B, H, S, D]   fp16 / bf16 (as the model makes it: a view of [B, S, H, D])
    key, value    [B, Hkv, L, D] the in-place cache after this call's write, q's dtype
    past_lengths  [B] int        query s of row b is at position past_b + s and reads slots <= it
    ->  o         [B, H, S, D]   q's dtype, q's strides

torch.ops.aten._flash_attention_forward (what torch.nn.attention.varlen_attn calls) in its varlen
form: the queries as [B * S, H, D], each row's keys the first seqused_k[b] = past_b + S slots of its
cache, causal with the diagonal at the bottom right (query s reads key j iff j <= past_b + s, the
cache's no-streaming mask), GQA from the head counts, fp32 softmax. The cache is read in place:
one row's [L, Hkv, D] is its [Hkv, L, D] slice transposed (a stride, no copy); several rows are a
paged view of the whole buffer (PAGE slots per page, a page table of each row's pages), which
needs L a multiple of PAGE. Streaming caches (sinks + ring) are not contiguous in position: they take
the Triton kernel (kernels.attention.triton.prefill_positions).
"""

from __future__ import annotations

import functools

import torch

PAGE = 256  # FlashAttention-2's paged K/V needs pages of a multiple of 256 slots
DTYPES = (torch.float16, torch.bfloat16)


@functools.cache
def _arguments() -> frozenset:
    op = getattr(torch.ops.aten, "_flash_attention_forward", None)
    if op is None or not torch.backends.cuda.is_flash_attention_available():
        return frozenset()
    return frozenset(a.name for a in op.default._schema.arguments)


def available() -> bool:
    """Whether this torch was built with flash attention (CUDA) and its varlen forward takes
    seqused_k (torch 2.11 does; one row at a time)."""
    return "seqused_k" in _arguments()


def paged() -> bool:
    """Whether it also takes block_table (paged K / V: several rows in one call; torch 2.13)."""
    return "block_table" in _arguments()


@functools.cache
def _sm80(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


def takes(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, window: int) -> bool:
    """Whether `flash_prefill` takes these (on a CUDA sm_80+ device): no streaming, one 16-bit dtype,
    D a multiple of 8 up to 256, H a multiple of Hkv, unit-stride head dims, and for B > 1 a cache
    of whole pages laid out [B, Hkv, L, D] with rows PAGE-aligned."""
    if window or q.dim() != 4 or key.dim() != 4 or value.shape != key.shape:
        return False
    B, H, S, D = q.shape
    Bk, Hkv, L, Dk = key.shape
    if (Bk != B or Dk != D or Hkv == 0 or H % Hkv or D % 8 or D > 256 or B * S * L == 0
            or q.dtype not in DTYPES or key.dtype != q.dtype or value.dtype != q.dtype):
        return False
    if not (q.is_cuda and available() and _sm80(q.device)):
        return False
    if any(t.stride(3) != 1 for t in (q, key, value)):
        return False
    return B == 1 or (paged() and all(_pages(t) is not None for t in (key, value)))


def _pages(cache: torch.Tensor):
    """(pages view [N, PAGE, Hkv, D], pages per batch row) of a cache [B, Hkv, L, D] whose rows start
    on a page and whose slots are PAGE-aligned, else None."""
    B, Hkv, L, D = cache.shape
    sb, sh, sl, _ = cache.stride()
    page = PAGE * sl
    if L % PAGE or sb % page or cache.storage_offset() % page:
        return None
    per_row = sb // page
    # the last row's last head ends at (B - 1) sb + (Hkv - 1) sh + L sl: pages up to there
    n = ((B - 1) * sb + L * sl) // page
    view = torch.as_strided(cache, (n, PAGE, Hkv, D), (page, sl, sh, 1), cache.storage_offset())
    return view, per_row


def flash_prefill(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_lengths: torch.Tensor,
                  scale: float) -> torch.Tensor:
    """o [B, H, S, D] (module docstring); call `takes` first."""
    B, H, S, D = q.shape
    Hkv, L = key.shape[1], key.shape[2]
    device = q.device
    qv = q.transpose(1, 2).reshape(B * S, H, D)  # no copy for the model's [B, S, H, D] layout
    cu_q = torch.arange(0, (B + 1) * S, S, dtype=torch.int32, device=device)
    cu_k = torch.arange(0, (B + 1) * L, L, dtype=torch.int32, device=device)
    used = (past_lengths + S).to(torch.int32)
    if B == 1:
        k, v, table = key[0].transpose(0, 1), value[0].transpose(0, 1), None
    else:
        (k, per_row), (v, _) = _pages(key), _pages(value)
        table = (torch.arange(B, dtype=torch.int32, device=device)[:, None] * per_row
                 + torch.arange(L // PAGE, dtype=torch.int32, device=device)[None, :])
    paging = {} if table is None else {"block_table": table}
    out = torch.ops.aten._flash_attention_forward(
        qv, k, v, cu_q, cu_k, S, L, 0.0, True, False, scale=float(scale), seqused_k=used, **paging)[0]
    o = out.view(B, S, H, D).transpose(1, 2)
    if o.stride() != q.stride():  # the op's output has q's strides (empty_like(q) for dense q)
        o = torch.empty_like(q).copy_(o)
    return o
