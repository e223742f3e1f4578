"""Which cache slots a query reads, from positions alone (the in-place K/V cache's mask).

A row at past length P writes its S new tokens at slots slot(P) .. slot(P) + S - 1, then query s (at
position P + s) reads slot j under the rule below. gdn_export.modules.kv_cache states the layout;
this is its arithmetic, shared by the mask the ONNX graph computes (`visibility`) and the kernels
that compute the same mask per tile (gdn::attention_at).

    slot(p) = p                              window 0 (no streaming; p < L)
    slot(p) = p if p < sinks, else sinks + (p - sinks) mod window        (streaming ring)

Slot j then holds A_j, the latest position <= P + S - 1 landing in j; query position Q reads j iff
A_j was written, A_j <= Q, and (A_j < sinks or A_j > Q - window) (window infinite without streaming:
j <= Q).
"""

from __future__ import annotations

import torch


def slot_of(positions: torch.Tensor, sinks: int, window: int) -> torch.Tensor:
    """Cache slot of absolute `positions` (any shape, int64): themselves without streaming (window
    0), else the sinks then the ring."""
    if not window:
        return positions
    return torch.where(positions < sinks, positions, sinks + torch.remainder(positions - sinks, window))


def visibility(past_lengths: torch.Tensor, seq: int, cache_len: int, sinks: int = 0, window: int = 0) -> torch.Tensor:
    """[B, 1, seq, cache_len] bool: may query s of row b (at position past_lengths[b] + s) read slot
    j (module docstring). past_lengths [B] int64."""
    L = cache_len
    device = past_lengths.device
    queries = past_lengths[:, None] + torch.arange(seq, device=device)  # [B, T]
    slots = torch.arange(L, device=device)
    if not window:
        return (slots[None, None, :] <= queries[:, :, None])[:, None]
    S, W = sinks, window
    last = (past_lengths + (seq - 1))[:, None]  # [B, 1]: the call's last written position
    # A_j: the latest position <= last that lands in ring slot j (j >= S); sinks hold themselves.
    ring = last - torch.remainder(slot_of(last, S, W) - slots[None, :], W)  # [B, L]
    sink = slots[None, :] < S
    stored = torch.where(sink, slots[None, :], ring)
    # (no Where on bool values: ONNX Runtime's CPU provider has no such kernel)
    written = (sink & (stored <= last)) | (~sink & (stored >= S))  # [B, L]
    stored, written = stored[:, None, :], written[:, None, :]
    q = queries[:, :, None]
    visible = written & (stored <= q) & ((stored < S) | (stored > q - W))
    return visible[:, None]
