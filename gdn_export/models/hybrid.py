"""`HybridForCausalLM`: the whole LM behind one forward used for both prefill and decode.

    forward(input_ids [B, T] int64, past_lengths [B] int64, seq_lens [B] int64, *states)
        -> (logits fp32 [B, 1, V] (or [B, T, V]), *new_states)

Rows are right-padded: row b has seq_lens[b] real tokens at absolute positions past_lengths[b] + t,
which drive rope and the attention mask. How the K/V cache and the outputs are shaped is the model's
`layout` (gdn_export.layout.DeployLayout, an export choice): by default an in-place cache of
`cache_len` slots per attention layer and logits of each row's last real token. States are the flat
tuple described in `gdn_export.models.cache`; prefill passes `empty_states(B)`. Padded tokens change
no state (gdn_export.modules.kv_cache says how), so rows of different lengths share a batch.

Module names follow transformers' checkpoints (model.embed_tokens, model.layers.{i}.linear_attn /
self_attn / mlp / input_layernorm / post_attention_layernorm (/ post_feedforward_layernorm in
OLMo-Hybrid's post-norm attention blocks), model.norm, lm_head), so a checkpoint's text weights load
by name; `gdn_export.weights` does the family-specific renaming, stacking and checks.

dtype: `model.to(dtype)` converts every parameter, as transformers does when loading in that dtype
(A_log, dt_bias and the norm weights included). The recurrent state is stored in
`layout.state_dtype` (fp32 by default), the decay g and all RMSNorms compute in fp32, logits are
returned in fp32.
"""

from __future__ import annotations

import torch
from torch import nn

from gdn_export.config import LINEAR, HybridConfig
from gdn_export.models.cache import BATCH, PAST, StateSpec, check_states
from gdn_export.layout import DEFAULT_LAYOUT, LOGITS_LAST, DeployLayout
from gdn_export.modules.kv_cache import StepInputs, check_call, make_step
from gdn_export.modules.gated_attention import GatedAttention
from gdn_export.modules.kv_cache_fp8 import kv_cache_dtype
from gdn_export.modules.gated_deltanet import GatedDeltaNet
from gdn_export.modules.mlp import SparseMoeBlock, SwiGLUMLP
from gdn_export.modules.norm import make_rmsnorm
from gdn_export.modules.olmo_hybrid import OlmoAttention, OlmoGatedDeltaNet
from gdn_export.modules.rotary import RotaryEmbedding
from gdn_export.ops import backends

# Mixer classes per family: (Gated DeltaNet, attention).
_MIXERS = {"olmo_hybrid": (OlmoGatedDeltaNet, OlmoAttention)}


class DecoderLayer(nn.Module):
    """One block; the mixer is GDN or attention. Pre-norm (every Qwen block, OLMo's GDN blocks):
    x + mixer(input_layernorm(x)), then x + mlp(post_attention_layernorm(x)). Post-norm (OLMo's
    attention blocks, config.attn_block_norm "post"): x + post_attention_layernorm(mixer(x)), then
    x + post_feedforward_layernorm(mlp(x))."""

    def __init__(self, config: HybridConfig, layer_idx: int, kind: str | None = None,
                 moe: bool | None = None) -> None:
        """kind (LINEAR / FULL) and moe default to config's for layer_idx (the MTP head's layer
        gives its own: gdn_export.models.mtp)."""
        super().__init__()
        self.kind = config.layer_kinds[layer_idx] if kind is None else kind
        linear_cls, attention_cls = _MIXERS.get(config.family, (GatedDeltaNet, GatedAttention))
        if self.kind == LINEAR:
            self.linear_attn = linear_cls(config, layer_idx)
        else:
            self.self_attn = attention_cls(config, layer_idx)
        if config.is_moe_layer(layer_idx) if moe is None else moe:
            self.mlp = SparseMoeBlock(config)
        else:
            self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size)
        self.post_norm = self.kind != LINEAR and config.attn_block_norm == "post"

        def norm():
            return make_rmsnorm(config.hidden_size, config.rms_norm_eps, config.zero_centered_norm)

        if self.post_norm:
            self.post_attention_layernorm, self.post_feedforward_layernorm = norm(), norm()
        else:
            self.input_layernorm, self.post_attention_layernorm = norm(), norm()

    def mix(self, h, step: StepInputs, state_a, state_b):
        """The block's mixer (GDN or attention) over h [B, T, hidden]: (out, state_a, state_b)."""
        mixer = self.linear_attn if self.kind == LINEAR else self.self_attn
        return mixer(h, step, state_a, state_b)

    def forward(self, x, step: StepInputs, state_a, state_b):
        """x [B, T, hidden]; (state_a, state_b) = (conv, recurrent) or (key, value)."""
        h = x if self.post_norm else self.input_layernorm(x)
        h, state_a, state_b = self.mix(h, step, state_a, state_b)
        if self.post_norm:
            x = x + self.post_attention_layernorm(h)
            return x + self.post_feedforward_layernorm(self.mlp(x)), state_a, state_b
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, state_a, state_b

    def forward_pending(self, x, pending, step: StepInputs, state_a, state_b):
        """`forward` of a pre-norm block with each residual add fused into the norm after it (one kernel
        each in eager GPU runs: gdn_export.ops.rms_norm.add_rms_norm). x [B, T, hidden]; pending: an
        addend of x not added yet (the previous block's MLP output [B, T, hidden]) or None. Returns
        (x, pending, state_a, state_b): x + pending is what `forward` returns as x."""
        mixer = self.linear_attn if self.kind == LINEAR else self.self_attn
        # add_for: where the mixer's / MLP's first projection is FP8 at prefill rows, the norm kernel
        # also writes its output's FP8 form for that projection (gdn_export.modules.norm)
        x, h = self.input_layernorm.add_for(x, pending, mixer)
        h, state_a, state_b = self.mix(h, step, state_a, state_b)
        x, h = self.post_attention_layernorm.add_for(x, h, self.mlp)
        return x, self.mlp(h), state_a, state_b


class HybridModel(nn.Module):
    """Embedding, decoder layers and final norm (transformers' `model.` prefix)."""

    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = make_rmsnorm(config.hidden_size, config.rms_norm_eps, config.zero_centered_norm)
        self.rotary_emb = RotaryEmbedding(config.rotary_dim, config.rope_theta)


class HybridForCausalLM(nn.Module):
    """Qwen3-Next / Qwen3.5 / Qwen3.5-MoE / OLMo-Hybrid text LM with an explicit flat state tuple
    (see module docstring)."""

    def __init__(self, config: HybridConfig, layout: DeployLayout = DEFAULT_LAYOUT) -> None:
        super().__init__()
        self.config = config
        self.layout = layout
        # False skips the eager checks of states and lengths (they read lengths back from the device:
        # a host sync that a CUDA graph cannot hold). Only for callers that checked them already, as
        # the runners do on the host (gdn_export.runtime.base); export never runs them either.
        self.check_inputs = True
        self.model = HybridModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.tie_weights()

    def tie_weights(self) -> None:
        """Share lm_head.weight with model.embed_tokens.weight (tie_word_embeddings)."""
        self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    # ------------------------------------------------------------------ states
    def state_specs(self) -> list[StateSpec]:
        """One StateSpec per state tensor, in the order forward takes and returns them."""
        c, dtype, specs = self.config, self.dtype, []
        kv_dtype = kv_cache_dtype(self, dtype)  # float8_e4m3fn with an FP8 K/V cache
        kv_len = self.layout.cache_len if self.layout.inplace else PAST
        for i, kind in enumerate(c.layer_kinds):
            if kind == LINEAR:
                specs.append(StateSpec(f"past.{i}.conv", (BATCH, c.conv_dim, c.linear_conv_kernel_dim - 1),
                                       dtype, i, "conv"))
                specs.append(StateSpec(f"past.{i}.recurrent", (BATCH, c.linear_num_value_heads,
                                       c.linear_key_head_dim, c.linear_value_head_dim),
                                       self.layout.state_dtype, i, "recurrent"))
            else:
                kv = (BATCH, c.num_key_value_heads, kv_len, c.head_dim)
                specs.append(StateSpec(f"past.{i}.key", kv, kv_dtype, i, "key"))
                specs.append(StateSpec(f"past.{i}.value", kv, kv_dtype, i, "value"))
        return specs

    def empty_states(self, batch: int, device: torch.device | str | None = None) -> list[torch.Tensor]:
        """Prefill states: zero conv / recurrent states and an empty K/V cache (all slots zero in
        place; P = 0 keys / values for the concat layout)."""
        device = self.device if device is None else device
        return [spec.zeros(batch, 0, device) for spec in self.state_specs()]

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, past_lengths: torch.Tensor, seq_lens: torch.Tensor,
                *states: torch.Tensor):
        """input_ids [B, T] int64 (rows right-padded), past_lengths [B] int64 (tokens each row has
        seen), seq_lens [B] int64 (real tokens per row, 0..T; 0: the row sits the call out); states
        as `state_specs()`.

        Returns (logits, *new_states): logits fp32 [B, 1, V] at each row's last real token
        (layout.logits "last") or [B, T, V]; new states in place (inplace K/V, eager) or new tensors.
        """
        B, T = input_ids.shape
        if self.check_inputs and not torch.compiler.is_compiling():
            check_states(self.state_specs(), states)
            check_call(past_lengths, seq_lens, T, self.layout)
        x = self.model.embed_tokens(input_ids)
        step = make_step(past_lengths, seq_lens, T, self.model.rotary_emb, x.dtype, self.layout)
        return self.run_layers(x, step, seq_lens, states)

    def hidden_states(self, input_ids: torch.Tensor, past_lengths: torch.Tensor, seq_lens: torch.Tensor,
                      *states: torch.Tensor, capture_steps: bool = False):
        """forward without the lm_head: (hidden [B, T, hidden] after the final norm at every
        position, in the model dtype, *new_states); what the lm_head and the MTP head
        (gdn_export.models.mtp) read.

        capture_steps: the verify form of speculative decoding (gdn_export.models.verify): each GDN
        layer returns, instead of its conv and recurrent states, the conv window [B, C, K-1+T] and
        the recurrent state after every token [B, T, Hv, Dk, Dv], from which `verify.roll_back`
        picks each row's state after its accepted tokens; K/V caches are written as usual."""
        B, T = input_ids.shape
        if self.check_inputs and not torch.compiler.is_compiling():
            check_states(self.state_specs(), states)
            check_call(past_lengths, seq_lens, T, self.layout)
        x = self.model.embed_tokens(input_ids)
        step = make_step(past_lengths, seq_lens, T, self.model.rotary_emb, x.dtype, self.layout,
                         capture_steps=capture_steps)
        x, new_states = self.layers_forward(x, step, states)
        return (self.model.norm(x), *new_states)

    def layers_forward(self, x: torch.Tensor, step: StepInputs, states) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The decoder layers over x [B, T, hidden]: (x after the last layer, new states). In eager GPU
        runs (backends.fused_eager) the pre-norm blocks add each residual inside the norm after it
        (`DecoderLayer.forward_pending`); traces and the CPU run `DecoderLayer.forward`."""
        new_states: list[torch.Tensor] = []
        pending = None
        fuse = backends.fused_eager(x)
        for i, layer in enumerate(self.model.layers):
            if fuse and not layer.post_norm:
                x, pending, a, b = layer.forward_pending(x, pending, step, states[2 * i], states[2 * i + 1])
            else:
                if pending is not None:
                    x, pending = x + pending, None
                x, a, b = layer(x, step, states[2 * i], states[2 * i + 1])
            new_states += [a, b]
        if pending is not None:
            x = x + pending
        return x, new_states

    def run_layers(self, x: torch.Tensor, step: StepInputs, seq_lens: torch.Tensor, states):
        """The decoder layers, final norm and lm_head over embeddings x [B, T, hidden] (what
        forward does after the embedding; gdn_export.models.vlm enters here with visual features).
        Returns (logits, *new_states) as forward."""
        B = x.shape[0]
        x, new_states = self.layers_forward(x, step, states)
        if self.layout.logits == LOGITS_LAST:
            # Only each row's last real token goes through the norm and the vocab projection.
            last = (seq_lens - 1).clamp(min=0)[:, None, None].expand(B, 1, x.shape[-1])
            x = torch.gather(x, 1, last)
        x = self.model.norm(x)
        logits = self.lm_head(x).float()
        return (logits, *new_states)
