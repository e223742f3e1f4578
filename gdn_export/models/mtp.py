"""`MtpModel`: the multi-token-prediction (MTP) head of Qwen3.5, Qwen3.5-MoE and Qwen3-Next, the
draft model of speculative decoding (gdn_export.runtime.speculative).

Checkpoint tensors (`mtp.*`, at the top level also in the vision-language layout), with
mtp_num_hidden_layers = 1 in config.json:

    mtp.pre_fc_norm_embedding.weight  [hidden]            zero-centred RMSNorm of the token embedding
    mtp.pre_fc_norm_hidden.weight     [hidden]            zero-centred RMSNorm of the model's hidden state
    mtp.fc.weight                     [hidden, 2*hidden]  over [norm(embedding); norm(hidden)]
    mtp.layers.0.*                    one full-attention decoder layer as the model's (input_layernorm,
                                      self_attn with q/k norms and the output gate, post_attention_layernorm,
                                      mlp: dense, or the sparse MoE block with a shared expert in the
                                      MoE families), with a K/V cache of its own
    mtp.norm.weight                   [hidden]            the norm before the lm_head

The embedding and the lm_head are the main model's (shared, not copied).

At position p the head reads h_p, the main model's hidden state at p after its final norm (what its
lm_head reads), and the token x_{p+1}, and predicts x_{p+2}:

    x = fc([pre_fc_norm_embedding(embed(x_{p+1})); pre_fc_norm_hidden(h_p)])
    y = norm(layer(x))      rope position p; attention over the head's own cache of positions <= p
    logits = lm_head(y)

A chain of drafts feeds y at p back as the hidden state of position p + 1 with the token it drafted
(as vLLM and SGLang chain the MTP drafts of these models). forward has the shape of
HybridForCausalLM.forward: right-padded rows, past_lengths, seq_lens, an in-place cache of
`layout.cache_len` slots, logits (and y) at each row's last real token or at every position.
"""

from __future__ import annotations

import torch
from torch import nn

from gdn_export.config import FULL, HybridConfig
from gdn_export.errors import ConfigError
from gdn_export.layout import DEFAULT_LAYOUT, LOGITS_LAST, DeployLayout
from gdn_export.models.cache import BATCH, PAST, StateSpec, check_states
from gdn_export.models.hybrid import DecoderLayer
from gdn_export.modules.kv_cache import check_call, make_step
from gdn_export.modules.norm import make_rmsnorm
from gdn_export.modules.rotary import RotaryEmbedding

# Families whose checkpoints carry an MTP head.
MTP_FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next")


class MtpHead(nn.Module):
    """The `mtp.*` tensors as modules (names as in the checkpoint, less the `mtp.` prefix): fc,
    pre_fc_norm_embedding, pre_fc_norm_hidden, layers (config.mtp_num_hidden_layers full-attention
    decoder layers, MoE in the MoE families), norm."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        if config.family not in MTP_FAMILIES:
            raise ConfigError(f"{config.family} checkpoints have no multi-token-prediction head "
                              f"(families with one: {', '.join(MTP_FAMILIES)})")
        hidden = config.hidden_size

        def norm():
            return make_rmsnorm(hidden, config.rms_norm_eps, config.zero_centered_norm)

        self.pre_fc_norm_embedding, self.pre_fc_norm_hidden = norm(), norm()
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        first = config.num_hidden_layers  # the MTP layers follow the model's in its numbering
        self.layers = nn.ModuleList(
            DecoderLayer(config, first + i, kind=FULL, moe=config.num_experts > 0)
            for i in range(config.mtp_num_hidden_layers))
        self.norm = norm()


class MtpModel(nn.Module):
    """The MTP head with the main model's embedding and lm_head (module docstring).

    forward(input_ids [B, T] int64 (the next tokens), hidden [B, T, hidden] (the model's normed
    hidden states at the same positions), past_lengths [B] int64, seq_lens [B] int64, key, value
    [B, Hkv, L, head_dim]) -> (logits fp32 [B, 1, V] or [B, T, V], y [B, 1, hidden] or [B, T, hidden]
    in the model dtype (the hidden state a chained draft feeds back), key, value (in place)).
    """

    def __init__(self, config: HybridConfig, head: MtpHead, embed_tokens: nn.Embedding, lm_head: nn.Linear,
                 layout: DeployLayout = DEFAULT_LAYOUT) -> None:
        super().__init__()
        if config.mtp_num_hidden_layers != 1:
            raise ConfigError(f"mtp_num_hidden_layers = {config.mtp_num_hidden_layers}: only single-layer "
                              f"MTP heads are supported (as published for Qwen3.5 and Qwen3-Next)")
        if not layout.inplace or layout.streaming:
            raise ConfigError("the MTP head needs an inplace kv cache without a streaming window")
        self.config = config
        self.layout = layout
        self.check_inputs = True  # as HybridForCausalLM.check_inputs
        self.mtp = head
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        self.rotary_emb = RotaryEmbedding(config.rotary_dim, config.rope_theta)

    @classmethod
    def for_model(cls, model, head: MtpHead) -> "MtpModel":
        """The head beside `model` (a HybridForCausalLM): its embedding, lm_head and layout."""
        return cls(model.config, head, model.model.embed_tokens, model.lm_head, model.layout)

    @property
    def dtype(self) -> torch.dtype:
        return self.mtp.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.mtp.fc.weight.device

    def state_specs(self) -> list[StateSpec]:
        """The head's K/V cache: past.{N}.key / past.{N}.value [B, Hkv, L, head_dim], N =
        num_hidden_layers (the MTP layer follows the model's)."""
        c, n = self.config, self.config.num_hidden_layers
        kv = (BATCH, c.num_key_value_heads, self.layout.cache_len if self.layout.inplace else PAST, c.head_dim)
        return [StateSpec(f"past.{n}.key", kv, self.dtype, n, "key"),
                StateSpec(f"past.{n}.value", kv, self.dtype, n, "value")]

    def empty_states(self, batch: int, device: torch.device | str | None = None) -> list[torch.Tensor]:
        device = self.device if device is None else device
        return [spec.zeros(batch, 0, device) for spec in self.state_specs()]

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, past_lengths: torch.Tensor,
                seq_lens: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
        B, T = input_ids.shape
        if self.check_inputs and not torch.compiler.is_compiling():
            check_states(self.state_specs(), (key, value))
            check_call(past_lengths, seq_lens, T, self.layout)
            if tuple(hidden.shape) != (B, T, self.config.hidden_size):
                raise ValueError(f"hidden must be [B, T, hidden] = {(B, T, self.config.hidden_size)}, "
                                 f"got {tuple(hidden.shape)}")
        head = self.mtp
        e = head.pre_fc_norm_embedding(self.embed_tokens(input_ids))
        h = head.pre_fc_norm_hidden(hidden.to(e.dtype))
        x = head.fc(torch.cat((e, h), dim=-1))
        step = make_step(past_lengths, seq_lens, T, self.rotary_emb, x.dtype, self.layout)
        x, key, value = head.layers[0](x, step, key, value)
        if self.layout.logits == LOGITS_LAST:
            last = (seq_lens - 1).clamp(min=0)[:, None, None].expand(B, 1, x.shape[-1])
            x = torch.gather(x, 1, last)
        y = head.norm(x)
        return self.lm_head(y).float(), y, key, value
