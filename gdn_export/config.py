"""`HybridConfig`: what gdn-export needs from a checkpoint's config.json, checked once.

Accepted model types (transformers' names):

    qwen3_next     Qwen3NextForCausalLM: fused GDN projections, sparse MoE MLPs
    qwen3_5_text   Qwen3_5ForCausalLM: split GDN projections, dense MLPs
    qwen3_5        Qwen3_5ForConditionalGeneration: its `text_config` is used; the vision tower is
                   not exported (a warning says so)
    qwen3_5_moe_text  Qwen3_5MoeForCausalLM: Qwen3.5 with a sparse MoE block (plus a gated shared
                   expert) in every layer, top-k probabilities always renormalised
    qwen3_5_moe    Qwen3_5MoeForConditionalGeneration: its `text_config`, as for qwen3_5
    olmo_hybrid    OlmoHybridForCausalLM (OLMo-Hybrid): separate q/k/v/a/b/g GDN projections with
                   beta in (0, 2) (`linear_allow_neg_eigval`), plain (not zero-centred) RMSNorms,
                   post-norm attention blocks with q/k norms over the whole projection and no
                   output gate, full rope or none at all (NoPE: no `rope_theta`, as released)

Fields missing from config.json take the defaults of transformers' config classes, so that a
checkpoint means the same model here as in transformers. A field gdn-export cannot honour raises
`ConfigError` naming the field. The transformers dict is parsed in `gdn_export.hf_config`; this
module holds the one description, `HybridConfig`, and its checks.

Rotary embedding: only the default rope (`rope_type` "default") is implemented; yarn, dynamic, linear
scaling and the rest raise `ConfigError`. Qwen3.5 stores an `mrope_section` for its vision model:
multimodal rope gives each of the three position streams (time, height, width) its own share of
the rotary frequencies. For text, the three streams carry the same position, so every frequency
sees that one position and mrope is exactly plain rope; it is recorded and otherwise unused.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gdn_export.errors import CheckpointError, ConfigError

LINEAR, FULL = "linear_attention", "full_attention"
FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid")
MODEL_TYPES = {"qwen3_next": "qwen3_next", "qwen3_5_text": "qwen3_5", "qwen3_5": "qwen3_5",
               "qwen3_5_moe_text": "qwen3_5_moe", "qwen3_5_moe": "qwen3_5_moe",
               "olmo_hybrid": "olmo_hybrid"}
# Composite (vision-language) model types whose text model is exported from `text_config`.
COMPOSITE = ("qwen3_5", "qwen3_5_moe")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

DEFAULT_ROPE_THETA = 10000.0
DEFAULT_PARTIAL_ROTARY = 0.25
DEFAULT_FULL_ATTENTION_INTERVAL = 4


@dataclass
class HybridConfig:
    """A hybrid Gated DeltaNet + gated attention LM, as gdn-export builds it.

    Shapes that follow from it: GDN conv channels `conv_dim` = 2*Hk*Dk + Hv*Dv (order q|k|v),
    recurrent state [Hv, Dk, Dv]; attention K/V [Hkv, P, head_dim], rotary on the first
    `rotary_dim` channels of each head.
    """

    family: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    layer_kinds: list[str]
    # gated (full) attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    attn_output_gate: bool = True
    attention_bias: bool = False
    # q_norm / k_norm over each head ("head", Qwen) or over the whole projection ("projection", OLMo)
    qk_norm: str = "head"
    # attention blocks: "pre" x + attn(norm(x)) (Qwen) or "post" x + norm(attn(x)) (OLMo)
    attn_block_norm: str = "pre"
    use_rope: bool = True  # False: NoPE (no rotary at all)
    rope_theta: float = DEFAULT_ROPE_THETA
    partial_rotary_factor: float = DEFAULT_PARTIAL_ROTARY
    mrope_section: list[int] | None = None
    max_position_embeddings: int = 32768
    # Gated DeltaNet (linear attention)
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    allow_neg_eigval: bool = False  # beta = 2 sigmoid(b) in (0, 2) instead of sigmoid(b)
    linear_norm_eps: float | None = None  # eps of the GDN output norm; None: rms_norm_eps
    # MLP / MoE (num_experts = 0: dense MLPs everywhere)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    # multi-token prediction: decoder layers of the `mtp.*` head (0: none; gdn_export.models.mtp),
    # and whether it has its own embedding instead of the model's
    mtp_num_hidden_layers: int = 0
    mtp_use_dedicated_embeddings: bool = False
    # the rest
    rms_norm_eps: float = 1e-6
    zero_centered_norm: bool = True  # RMSNorm scale (1 + w) (Qwen) or w (OLMo)
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ derived
    @property
    def conv_dim(self) -> int:
        """Channels of the GDN causal conv: q|k|v = 2*Hk*Dk + Hv*Dv."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + (
            self.linear_num_value_heads * self.linear_value_head_dim
        )

    @property
    def rotary_dim(self) -> int:
        """Channels of each attention head that rope rotates (the first ones)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def gdn_norm_eps(self) -> float:
        """eps of the GDN output (gated) RMSNorm."""
        return self.rms_norm_eps if self.linear_norm_eps is None else self.linear_norm_eps

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer `layer` uses the sparse MoE block (transformers' rule for Qwen3-Next)."""
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise ConfigError naming the first field that gdn-export cannot honour."""
        if self.family not in FAMILIES:
            raise ConfigError(f"family {self.family!r} is not one of {', '.join(FAMILIES)}")
        n = self.num_hidden_layers
        if not _is_int(n) or n < 1:
            raise ConfigError(f"num_hidden_layers must be a positive integer, got {n!r}")
        for name in _FLAGS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ConfigError(f"{name} must be true or false, got {value!r}")
        for name, value in (("rms_norm_eps", self.rms_norm_eps), ("linear_norm_eps", self.linear_norm_eps),
                            ("rope_theta", self.rope_theta if self.use_rope else None),
                            ("partial_rotary_factor", self.partial_rotary_factor)):
            if value is not None and not is_number(value, positive=True):
                raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
        if not isinstance(self.layer_kinds, list):
            raise ConfigError(f"layer_types must be a list, got {self.layer_kinds!r}")
        if len(self.layer_kinds) != self.num_hidden_layers:
            raise ConfigError(
                f"layer_types has {len(self.layer_kinds)} entries but num_hidden_layers is "
                f"{self.num_hidden_layers}"
            )
        for i, kind in enumerate(self.layer_kinds):
            if kind not in (LINEAR, FULL):
                raise ConfigError(f"layer_types[{i}] = {kind!r}; supported: {LINEAR!r}, {FULL!r}")
        if not _is_int(self.num_experts) or self.num_experts < 0:
            raise ConfigError(f"num_experts must be an integer >= 0, got {self.num_experts!r}")
        if self.num_experts:
            for name, low in (("num_experts_per_tok", 1), ("moe_intermediate_size", 1),
                              ("shared_expert_intermediate_size", 0), ("decoder_sparse_step", 1)):
                value = getattr(self, name)
                if not _is_int(value) or value < low:
                    raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
            if not isinstance(self.mlp_only_layers, list) or not all(
                    _is_int(i) and 0 <= i < n for i in self.mlp_only_layers):
                raise ConfigError(f"mlp_only_layers must be a list of layer indices in [0, {n}), "
                                  f"got {self.mlp_only_layers!r}")
        if not _is_int(self.mtp_num_hidden_layers) or self.mtp_num_hidden_layers < 0:
            raise ConfigError(f"mtp_num_hidden_layers must be an integer >= 0, got {self.mtp_num_hidden_layers!r}")
        dense = any(not self.is_moe_layer(i) for i in range(self.num_hidden_layers))
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "linear_num_key_heads",
                     "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                     "linear_conv_kernel_dim") + (("intermediate_size",) if dense else ()):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.linear_conv_kernel_dim < 2:
            raise ConfigError(f"linear_conv_kernel_dim must be >= 2, got {self.linear_conv_kernel_dim}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(
                f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                f"linear_num_key_heads ({self.linear_num_key_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            raise ConfigError(f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}")
        if self.rotary_dim < 2 or self.rotary_dim % 2:
            raise ConfigError(
                f"partial_rotary_factor {self.partial_rotary_factor} x head_dim {self.head_dim} gives "
                f"{self.rotary_dim} rotary channels; need a positive even number"
            )
        if self.hidden_act != "silu":
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported (only 'silu')")
        if self.dtype not in DTYPES:
            raise ConfigError(f"torch_dtype/dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        for name, value, allowed in (("qk_norm", self.qk_norm, ("head", "projection")),
                                     ("attn_block_norm", self.attn_block_norm, ("pre", "post"))):
            if value not in allowed:
                raise ConfigError(f"{name} {value!r} is not one of {', '.join(allowed)}")
        if self.num_experts:
            if self.family not in ("qwen3_next", "qwen3_5_moe"):
                raise ConfigError(f"num_experts is only supported for qwen3_next and qwen3_5_moe, "
                                  f"not {self.family}")
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ConfigError(
                    f"num_experts_per_tok must be in [1, num_experts={self.num_experts}], "
                    f"got {self.num_experts_per_tok}"
                )

    # ------------------------------------------------------------------ I/O
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of every field; `from_dict` reads it back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HybridConfig":
        """Read back the output of `to_dict`. A transformers config.json dict is parsed by
        `gdn_export.hf_config.parse_config`, which also takes this form."""
        if not isinstance(d, dict):
            raise ConfigError(f"config must be a JSON object, got {type(d).__name__}")
        if not is_own_dict(d):
            raise ConfigError("not a HybridConfig dict (no 'family' / 'layer_kinds'); parse a transformers "
                              "config.json with gdn_export.hf_config.parse_config")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"unknown HybridConfig field(s): {', '.join(unknown)}")
        return cls(**d)


# The true / false fields: JSON booleans only (a string "false" is truthy in Python).
_FLAGS = ("attn_output_gate", "attention_bias", "use_rope", "allow_neg_eigval", "norm_topk_prob",
          "zero_centered_norm", "tie_word_embeddings", "mtp_use_dedicated_embeddings")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any, positive: bool = False) -> bool:
    """Whether value is a finite JSON number (int or float, not a bool or a string), > 0 if positive."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value > 0 if positive else True


def is_own_dict(d: dict[str, Any]) -> bool:
    """Whether `d` is HybridConfig.to_dict's form rather than a transformers config.json."""
    return "family" in d and "layer_kinds" in d
