"""Qwen3.5's multi-token-prediction (MTP) head, built from transformers' own Qwen3.5 modules, in the
checkpoint layout of the published models (keys `mtp.*`, which transformers and gdn-export skip
when they load the main model):

    mtp.pre_fc_norm_embedding.weight  [H]       RMSNorm (1 + w) of the next token's embedding
    mtp.pre_fc_norm_hidden.weight     [H]       RMSNorm (1 + w) of the main model's hidden state
    mtp.fc.weight                     [H, 2H]   over the concatenation [embedding; hidden]
    mtp.layers.0.*                              one full-attention decoder layer (gated attention
                                                and the model's MLP, Qwen3_5DecoderLayer's names)
    mtp.norm.weight                   [H]       final RMSNorm; the logits come from the shared lm_head

At position t the head takes the main model's final hidden state h_t (after model.norm: what the
lm_head reads to predict token t+1) and the embedding of token t+1, runs the decoder layer
causally over positions 0..t with the main model's rotary embedding at position t, and predicts
token t+2 through the main model's lm_head (shared, as the embedding is):

    x'_t = fc([norm_e(embed(x_{t+1})); norm_h(h_t)]);  logits_{t+2} = lm_head(norm(layer(x')_t))

For drafting (issue 44), after the main model emitted token t+1 from h_t, the head drafts t+2; a
chain of drafts feeds the head's own output hidden state (before mtp.norm) back as the next h.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

MTP_PREFIX = "mtp."


class MtpHead(nn.Module):
    """The `mtp.*` module of a Qwen3_5TextConfig (transformers' RMSNorm and decoder layer)."""

    def __init__(self, config) -> None:
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        super().__init__()
        H, eps = config.hidden_size, config.rms_norm_eps
        layer_config = copy.deepcopy(config)
        layer_config.num_hidden_layers = 1
        layer_config.layer_types = ["full_attention"]
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(H, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(H, eps=eps)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(layer_config, 0)])
        self.norm = Qwen3_5RMSNorm(H, eps=eps)
        std = config.initializer_range
        for m in self.modules():  # transformers' initialisation: N(0, std) linears, zero (1 + w) norms
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)
            elif isinstance(m, Qwen3_5RMSNorm):
                nn.init.zeros_(m.weight)

    def forward(self, next_embeds: torch.Tensor, hidden: torch.Tensor, position_embeddings) -> torch.Tensor:
        """next_embeds [B, T, H] (embedding of tokens 1..T), hidden [B, T, H] (the main model's
        normed hidden states at 0..T-1), position_embeddings (cos, sin) of positions 0..T-1 from the
        main model's rotary_emb -> [B, T, H] after mtp.norm (lm_head input for tokens 2..T+1)."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], -1))
        x = self.layers[0](x, position_embeddings=position_embeddings, attention_mask=None)  # causal (SDPA)
        return self.norm(x)


def positions(model, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The main model's rotary (cos, sin) for positions 0..T-1 of hidden [B, T, H]."""
    B, T = hidden.shape[:2]
    ids = torch.arange(T, device=hidden.device)[None, None].expand(3, B, T)
    return model.model.rotary_emb(hidden, ids)


def mtp_logits(model, mtp: MtpHead, next_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] of tokens 2..T+1: next_ids [B, T] are tokens 1..T, hidden [B, T, H] the main
    model's hidden states (after model.norm) at positions 0..T-1; the shared embedding and lm_head."""
    return model.lm_head(mtp(model.model.embed_tokens(next_ids), hidden, positions(model, hidden)))


def state_dict(mtp: MtpHead, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """{"mtp.<name>": tensor in dtype}: the head's tensors under their checkpoint names."""
    return {MTP_PREFIX + k: v.detach().to(dtype).contiguous() for k, v in mtp.state_dict().items()}
