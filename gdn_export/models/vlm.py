"""`HybridVLForCausalLM`: the language model of a Qwen3.5 / Qwen3.5-MoE vision-language checkpoint,
taking visual features and 3-D multimodal rotary positions.

    forward(input_ids [B, T] int64, past_lengths [B] int64, seq_lens [B] int64,
            rope_positions [3, B, T] int64, visual_embeds [N, hidden], visual_index [N] int64, *states)
        -> (logits fp32 [B, 1, V] (or [B, T, V]), *new_states)

The token embeddings of input_ids are computed as in `HybridForCausalLM`, then row n of
visual_embeds replaces the embedding of token visual_index[n] (a flat index b * T + t); N = 0 for
text-only calls and decode steps. Rotary angles come from rope_positions (temporal, height, width
streams) split by `mrope_section` (transformers' default [11, 11, 10] when the config has none) as transformers'
Qwen3.5 text rotary does: frequency j uses the
height stream when j % 3 == 1 and j < 3 * section[1], the width stream when j % 3 == 2 and
j < 3 * section[2], else the temporal one. With equal streams this is the plain rope of
`HybridForCausalLM`. Cache slots, the attention mask, padding and states follow past_lengths /
seq_lens exactly as there; everything else (layers, states, layout) is inherited.
"""

from __future__ import annotations

import torch

from gdn_export.errors import InputError
from gdn_export.models.cache import check_states
from gdn_export.models.hybrid import HybridForCausalLM
from gdn_export.modules.kv_cache import check_call, make_step


# transformers' Qwen3.5 text rotary uses this when rope_parameters has no mrope_section.
DEFAULT_MROPE_SECTION = [11, 11, 10]


def mrope_streams(rotary_dim: int, mrope_section: list[int] | None,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """[3, R/2] fp32 one-hot: which position stream (temporal, height, width) drives each rotary
    frequency (module docstring); mrope_section None means transformers' default [11, 11, 10]."""
    mrope_section = DEFAULT_MROPE_SECTION if mrope_section is None else mrope_section
    rows = [[0.0] * (rotary_dim // 2) for _ in range(3)]
    for j in range(rotary_dim // 2):
        stream = 0
        if mrope_section and j % 3 == 1 and j < 3 * mrope_section[1]:
            stream = 1
        elif mrope_section and j % 3 == 2 and j < 3 * mrope_section[2]:
            stream = 2
        rows[stream][j] = 1.0
    return torch.tensor(rows, dtype=torch.float32, device=device)


def mrope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, streams: torch.Tensor,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, T, R] in `dtype` for positions [3, B, T] int64, inv_freq [R/2] fp32 and the
    one-hot streams [3, R/2] (exact: each frequency is one stream's angle times 1, plus zeros)."""
    freqs = positions[..., None].to(torch.float32) * inv_freq  # [3, B, T, R/2]
    freqs = (freqs * streams[:, None, None, :]).sum(0)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class HybridVLForCausalLM(HybridForCausalLM):
    """See module docstring. `config.mrope_section` splits the rotary frequencies."""

    def forward(self, input_ids: torch.Tensor, past_lengths: torch.Tensor, seq_lens: torch.Tensor,
                rope_positions: torch.Tensor, visual_embeds: torch.Tensor, visual_index: torch.Tensor,
                *states: torch.Tensor):
        """Module docstring; states as `state_specs()`."""
        B, T = input_ids.shape
        hidden = self.config.hidden_size
        if self.check_inputs and not torch.compiler.is_compiling():
            check_states(self.state_specs(), states)
            check_call(past_lengths, seq_lens, T, self.layout)
            check_visual(rope_positions, visual_embeds, visual_index, B, T, hidden)
        x = self.model.embed_tokens(input_ids)
        x = x.reshape(B * T, hidden).index_put((visual_index,), visual_embeds.to(x.dtype)).reshape(B, T, hidden)
        step = make_step(past_lengths, seq_lens, T, self.model.rotary_emb, x.dtype, self.layout)
        streams = mrope_streams(self.config.rotary_dim, self.config.mrope_section, x.device)
        step.cos, step.sin = mrope_tables(rope_positions, self.model.rotary_emb.inv_freq(x.device),
                                          streams, x.dtype)
        return self.run_layers(x, step, seq_lens, states)


def check_visual(rope_positions, visual_embeds, visual_index, batch: int, seq: int, hidden: int) -> None:
    """InputError unless the visual inputs fit a call of [batch, seq] tokens (eager only)."""
    if tuple(rope_positions.shape) != (3, batch, seq):
        raise InputError(f"rope_positions must be [3, {batch}, {seq}], got {tuple(rope_positions.shape)}")
    if visual_embeds.dim() != 2 or visual_embeds.shape[1] != hidden:
        raise InputError(f"visual_embeds must be [num_visual, {hidden}], got {tuple(visual_embeds.shape)}")
    if tuple(visual_index.shape) != (visual_embeds.shape[0],):
        raise InputError(f"visual_index must be [{visual_embeds.shape[0]}] (one per visual_embeds row), "
                         f"got {tuple(visual_index.shape)}")
    if visual_index.numel() and (int(visual_index.min()) < 0 or int(visual_index.max()) >= batch * seq):
        raise InputError(f"visual_index must lie in [0, {batch * seq}) (flat b * seq + t)")
    if visual_index.numel() != torch.unique(visual_index).numel():
        raise InputError("visual_index names a token twice")
