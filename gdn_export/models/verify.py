"""The verify step of speculative decoding on HybridForCausalLM, and the roll-back after it.

A verify call runs T = K + 1 tokens per row (the last accepted token, then K drafts) through
`model.hidden_states(ids, past_lengths, seq_lens, *states, capture_steps=True)`, which returns, in
place of each layer's states (gdn_export.models.cache):

    linear_attention  past.{i}.conv       -> the conv window      [B, C, K-1+T]       model dtype
                                             (the old conv state, then the T new conv inputs)
                      past.{i}.recurrent  -> the state after every token [B, T, Hv, Dk, Dv]  state dtype
    full_attention    past.{i}.key/value  -> the caches, the T tokens written at each row's slots

`roll_back` then keeps, for each row b, the states after its first kept[b] tokens:

    conv       window[b, :, kept[b] : kept[b] + K-1]
    recurrent  steps[b, max(kept[b] - 1, 0)]
    key/value  as they are: the slots past the row's new length hold rejected tokens, which no
               query reads (a query at position P reads slots <= P: gdn_export.modules.kv_cache)
               and the row's next call overwrites

kept[b] is in [1, seq_lens[b]], or 0 for a row that sat the call out (seq_lens 0: its padded
tokens are identity steps, so steps[b, 0] is its old state and the window starts with it). The
streaming cache is excluded (a verify could overwrite ring entries that a rejected draft then
loses) and so is the concat cache (its K/V would need cutting): `check_layout` says so.
"""

from __future__ import annotations

import torch

from gdn_export.errors import InputError
from gdn_export.layout import DeployLayout


def check_layout(layout: DeployLayout) -> None:
    """InputError unless speculative decoding can roll this layout's caches back."""
    if not layout.inplace:
        raise InputError("speculative decoding needs the inplace kv cache layout (rejected drafts are "
                         "dropped by length), not --kv-cache concat")
    if layout.streaming:
        raise InputError("speculative decoding needs a cache without a streaming window: a verify call "
                         "overwrites ring slots that a rejected draft cannot give back")


def roll_back(model, step_states, kept: torch.Tensor, out: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """The states after each row's first kept[b] tokens of a verify call (module docstring).

    model: the HybridForCausalLM the call ran on (its state_specs say which state is which);
    step_states: the call's returned states; kept [B] int64 on their device. With `out` (the
    states the call started from, e.g. a runner's static buffers) the results are written into
    those tensors and returned; the K/V caches are already in place either way. No host sync: a
    CUDA graph can hold it. One gather a GDN state, straight into `out` where the dtypes agree:
    the index tensors are made once for all layers.
    """
    specs = model.state_specs()
    width = model.config.linear_conv_kernel_dim - 1
    index: dict = {}
    result = []
    for i, (spec, t) in enumerate(zip(specs, step_states)):
        target = out[i] if out is not None else None
        if target is not None and (target.dtype != t.dtype or not target.is_contiguous()):
            target = None  # gathered first, then copied (converted) into out[i]
        if spec.kind == "conv":  # [B, C, K-1+T] -> [B, C, K-1]
            B, C, _ = t.shape
            key = ("conv", C)
            if key not in index:
                index[key] = (kept[:, None, None] + torch.arange(width, device=t.device)).expand(B, C, width)
            new = torch.gather(t, 2, index[key], out=target) if target is not None else torch.gather(t, 2, index[key])
        elif spec.kind == "recurrent":  # [B, T, Hv, Dk, Dv] -> [B, Hv, Dk, Dv]
            B, T = t.shape[:2]
            key = ("recurrent", T)
            if key not in index:
                index[key] = torch.arange(B, device=t.device) * T + (kept - 1).clamp(min=0)
            flat = t.reshape(B * T, *t.shape[2:])
            new = (torch.index_select(flat, 0, index[key], out=target) if target is not None
                   else torch.index_select(flat, 0, index[key]))
        else:
            new = t
        if out is not None and new is not out[i]:
            out[i].copy_(new)
            new = out[i]
        result.append(new)
    return result
