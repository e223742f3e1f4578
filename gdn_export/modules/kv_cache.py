"""Per-call inputs shared by every layer: positions, real-token masks, cache slots and visibility.

A call runs T tokens for each of B rows. Rows are right-padded: row b has seq_lens[b] real tokens
(1 <= seq_lens[b] <= T) at absolute positions past_lengths[b] + t. Padded tokens must not change any
state: the GDN layers give them g = 0 and beta = 0 (an exact identity step of the gated delta rule)
and the conv takes seq_lens; the attention layers write them into cache slots that no real query
can see (see below).

In-place cache of L slots (DeployLayout.inplace). Position p is stored in slot

    slot(p) = p                          without streaming (p < L)
    slot(p) = p            if p < S      with S sinks and a ring of W = L - S slots
              S + (p - S) mod W   else

Each call first writes its T tokens of row b at slots slot(past_b) .. slot(past_b) + T - 1 (never
across the ring's end: callers split such calls, `check_call` says so), then every query reads the
cache under a mask. Slot j of row b holds A_j, the latest position <= past_b + T - 1 that maps to j.
Query at position P may read slot j when

    A_j <= P                                      (written, and not in its future)
    and (A_j < S or A_j > P - W)                  (a sink, or in its window; W = infinity unless
                                                   streaming)

Without streaming this is the causal mask j <= P. Padded tokens of row b sit at positions
>= past_b + seq_lens[b], after every real query of the row, so no real query reads them; the next
call overwrites them (without streaming) or, in streaming mode, they write back the slot's old
content (`keep_old`) so that ring entries still in a later window survive. Within a streaming call
of T > 1 tokens, query t reads the ring as it stands after the call's writes, so it misses the
entries of its window that the call's later tokens overwrote (at most T - 1 - t of its W); a decode
step (T = 1) reads exactly the sinks and the last W positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gdn_export.errors import InputError
from gdn_export.layout import DeployLayout
from gdn_export.ops.backends import can_call_directly, exporting
from gdn_export.ops.dtypes import as_dtype
from gdn_export.ops.attention.positions import slot_of as positions_slot_of
from gdn_export.ops.attention.positions import visibility as positions_visibility


@dataclass
class StepInputs:
    """What one forward call tells every layer (built once per call by `make_step`).

    positions    [B, T] int64 absolute position of every token
    seq_lens     [B] int64 real tokens per row
    token_mask   [B, T] bool, True on real tokens
    cos, sin     [B, T, R] rotary tables in the model dtype
    write_index  [B] int64 first cache slot each row writes (inplace layout; else None)
    past_lengths [B] int64 position of each row's first token (inplace layout; else None)
    layout       the call's DeployLayout; `sinks` / `window` (0 without streaming) with
                 past_lengths are what the attention kernels derive the mask from (gdn::attention_at)
    keep_old     padded tokens write back the slot's old content (streaming)
    capture_steps  GDN layers return every token's state (the verify form: HybridForCausalLM.hidden_states)
    attn_mask    [B, 1, T, L] bool slots each query may read (inplace layout; else None), built on
                 first use and shared by the layers: the ONNX graph's and decode steps' form;
                 the runtime's attention layers take positions instead (a long chunk's T x L mask
                 is GiBs)
    """

    positions: torch.Tensor
    seq_lens: torch.Tensor
    token_mask: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    write_index: torch.Tensor | None
    past_lengths: torch.Tensor | None
    layout: DeployLayout
    keep_old: bool
    capture_steps: bool = False
    _mask: torch.Tensor | None = None
    _seq_lens_i32: torch.Tensor | None = None

    @property
    def sinks(self) -> int:
        return self.layout.sinks

    @property
    def window(self) -> int:
        return self.layout.window if self.layout.streaming else 0

    def seq_lens_int32(self) -> torch.Tensor:
        """seq_lens as int32 [B] (the GDN conv's form): cast once per call in eager mode; in traces each
        layer casts its own (every layer's subgraph stays alike)."""
        if not can_call_directly(self.seq_lens):
            return as_dtype(self.seq_lens, torch.int32)
        if self._seq_lens_i32 is None:
            self._seq_lens_i32 = as_dtype(self.seq_lens, torch.int32)
        return self._seq_lens_i32

    @property
    def attn_mask(self) -> torch.Tensor | None:
        if self._mask is None and self.write_index is not None:
            self._mask = visibility(self.past_lengths, self.positions.shape[1], self.layout)
        return self._mask


def slot_of(positions: torch.Tensor, layout: DeployLayout) -> torch.Tensor:
    """Cache slot of absolute `positions` (any shape, int64) under `layout`."""
    return positions_slot_of(positions, layout.sinks, layout.window if layout.streaming else 0)


def visibility(past_lengths: torch.Tensor, seq: int, layout: DeployLayout) -> torch.Tensor:
    """[B, 1, T, L] bool: may query t of row b read slot j (module docstring;
    gdn_export.ops.attention.positions)."""
    return positions_visibility(past_lengths, seq, layout.cache_len, layout.sinks,
                                layout.window if layout.streaming else 0)


def check_call(past_lengths: torch.Tensor, seq_lens: torch.Tensor, seq: int, layout: DeployLayout) -> None:
    """InputError unless the call's lengths fit the layout (eager only: the graph cannot raise)."""
    if past_lengths.dim() != 1 or seq_lens.shape != past_lengths.shape:
        raise InputError(f"past_lengths and seq_lens must both be [batch], got "
                         f"{tuple(past_lengths.shape)} and {tuple(seq_lens.shape)}")
    if bool((past_lengths < 0).any()):
        raise InputError(f"past lengths must be >= 0, got {past_lengths.tolist()}")
    if bool(((seq_lens < 0) | (seq_lens > seq)).any()):
        raise InputError(f"row lengths must be in [0, {seq}] (the padded length), got {seq_lens.tolist()}")
    if not layout.inplace:
        return
    L = layout.cache_len
    first = slot_of(past_lengths, layout)
    if layout.streaming:
        if bool((first + seq > L).any()):
            raise InputError(f"a call of {seq} tokens would cross the end of the {L}-slot streaming "
                             f"cache (first slots {first.tolist()}); split it (the runners do)")
    elif bool((past_lengths + seq > L).any()):
        raise InputError(f"rows at past lengths {past_lengths.tolist()} plus {seq} tokens exceed the "
                         f"cache of {L} slots; export with a larger --max-cache-len or an "
                         f"--attention-window")


def tokens_until_wrap(past_lengths, layout: DeployLayout) -> int:
    """The most tokens one call may hold for rows at `past_lengths` (a sequence of ints) without
    overflowing the cache (<= 0: full) or crossing the streaming ring's end (always >= 1)."""
    L = layout.cache_len
    if not layout.inplace:
        return 2**62
    if not layout.streaming:
        return L - max(past_lengths)
    S, W = layout.sinks, layout.window
    return min(L - (p if p < S else S + (p - S) % W) for p in past_lengths)


def make_step(past_lengths: torch.Tensor, seq_lens: torch.Tensor, seq: int, rotary, dtype,
              layout: DeployLayout, capture_steps: bool = False) -> StepInputs:
    """StepInputs for a call of `seq` tokens per row (see StepInputs)."""
    device = past_lengths.device
    steps = torch.arange(seq, device=device)
    positions = past_lengths[:, None] + steps  # [B, T]
    token_mask = steps[None, :] < seq_lens[:, None]
    cos, sin = rotary(positions, dtype)
    write_index = past = None
    if layout.inplace:
        write_index = slot_of(past_lengths, layout)
        past = past_lengths
    step = StepInputs(positions, seq_lens, token_mask, cos, sin, write_index, past, layout,
                      keep_old=layout.streaming, capture_steps=capture_steps)
    if layout.inplace and exporting():
        # the graph computes its mask once, before the layers (each layer's subgraph then reads it
        # alike: what gdn_export.onnx's per-kind tracing relies on)
        step.attn_mask  # noqa: B018
    return step
