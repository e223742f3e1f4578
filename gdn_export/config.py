"""`HybridConfig`: what gdn-export needs from a checkpoint's config.json, checked once.

Accepted model types (transformers' names):

    qwen3_next     Qwen3NextForCausalLM: fused GDN projections, sparse MoE MLPs
    qwen3_5_text   Qwen3_5ForCausalLM: split GDN projections, dense MLPs
    qwen3_5        Qwen3_5ForConditionalGeneration: its `text_config` is used; the vision tower is
                   not exported (a warning says so)

Fields missing from config.json take the defaults of transformers' config classes, so that a
checkpoint means the same model here as in transformers. A field gdn-export cannot honour raises
`ConfigError` naming the field.

Rotary embedding: only the default rope (`rope_type` "default") is implemented; yarn, dynamic, linear
scaling and the rest raise `ConfigError`. Qwen3.5 stores an `mrope_section` for its vision model:
multimodal rope gives each of the three position streams (time, height, width) its own share of
the rotary frequencies. For text, the three streams carry the same position, so every frequency
sees that one position and mrope is exactly plain rope; it is recorded and otherwise unused.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gdn_export.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)

LINEAR, FULL = "linear_attention", "full_attention"
FAMILIES = ("qwen3_next", "qwen3_5")
MODEL_TYPES = {"qwen3_next": "qwen3_next", "qwen3_5_text": "qwen3_5", "qwen3_5": "qwen3_5"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# transformers' defaults (Qwen3NextConfig / Qwen3_5TextConfig), used where config.json is silent.
_COMMON_DEFAULTS: dict[str, Any] = {
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "head_dim": 256,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "max_position_embeddings": 32768,
    "attn_output_gate": True,
}
_DEFAULTS = {
    "qwen3_next": {
        **_COMMON_DEFAULTS,
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
        "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
        "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "norm_topk_prob": True,
        "decoder_sparse_step": 1,
    },
    "qwen3_5": {
        **_COMMON_DEFAULTS,
        "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4,
    },
}
_DEFAULT_ROPE_THETA = 10000.0
_DEFAULT_PARTIAL_ROTARY = 0.25
_DEFAULT_FULL_ATTENTION_INTERVAL = 4


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
    rope_theta: float = _DEFAULT_ROPE_THETA
    partial_rotary_factor: float = _DEFAULT_PARTIAL_ROTARY
    mrope_section: list[int] | None = None
    max_position_embeddings: int = 32768
    # Gated DeltaNet (linear attention)
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    # MLP / MoE (num_experts = 0: dense MLPs everywhere)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    # the rest
    rms_norm_eps: float = 1e-6
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
        if len(self.layer_kinds) != self.num_hidden_layers:
            raise ConfigError(
                f"layer_types has {len(self.layer_kinds)} entries but num_hidden_layers is "
                f"{self.num_hidden_layers}"
            )
        for i, kind in enumerate(self.layer_kinds):
            if kind not in (LINEAR, FULL):
                raise ConfigError(f"layer_types[{i}] = {kind!r}; supported: {LINEAR!r}, {FULL!r}")
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "linear_num_key_heads",
                     "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                     "linear_conv_kernel_dim", "intermediate_size"):
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
        if self.num_experts < 0:
            raise ConfigError(f"num_experts must be >= 0, got {self.num_experts}")
        if self.num_experts:
            if self.family != "qwen3_next":
                raise ConfigError(f"num_experts is only supported for qwen3_next, not {self.family}")
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ConfigError(
                    f"num_experts_per_tok must be in [1, num_experts={self.num_experts}], "
                    f"got {self.num_experts_per_tok}"
                )
            if self.decoder_sparse_step < 1:
                raise ConfigError(f"decoder_sparse_step must be >= 1, got {self.decoder_sparse_step}")
            for name in ("moe_intermediate_size", "shared_expert_intermediate_size"):
                if getattr(self, name) < 0:
                    raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
            if self.moe_intermediate_size < 1:
                raise ConfigError(f"moe_intermediate_size must be >= 1, got {self.moe_intermediate_size}")

    # ------------------------------------------------------------------ I/O
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of every field; `from_dict` reads it back."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HybridConfig":
        """Parse a transformers config.json dict (or the output of `to_dict`)."""
        if not isinstance(d, dict):
            raise ConfigError(f"config must be a JSON object, got {type(d).__name__}")
        if "family" in d and "layer_kinds" in d:
            names = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(d) - names)
            if unknown:
                raise ConfigError(f"unknown HybridConfig field(s): {', '.join(unknown)}")
            return cls(**d)
        return _from_hf_dict(d)

    @classmethod
    def from_file(cls, path: str | Path) -> "HybridConfig":
        """Read a config.json; a missing or malformed file is a CheckpointError naming it."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CheckpointError(f"{path}: config file not found") from None
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot read config ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            raise CheckpointError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                                  f"offset {exc.start}); config.json must be UTF-8 JSON") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno})") from None
        return cls.from_dict(d)


# ---------------------------------------------------------------------- transformers dict
def _get(d: dict, name: str, family: str) -> Any:
    value = d.get(name)
    return _DEFAULTS[family][name] if value is None else value


def _rope(d: dict) -> tuple[float, float, list[int] | None]:
    """(rope_theta, partial_rotary_factor, mrope_section) from the old or new rope fields."""
    params = d.get("rope_parameters")
    if params is None:
        params = d.get("rope_scaling")  # transformers < 5 spelling
        where = "rope_scaling"
    else:
        where = "rope_parameters"
    if params is not None and not isinstance(params, dict):
        raise ConfigError(f"{where} must be an object, got {params!r}")
    params = dict(params or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    # Qwen3.5 writes rope_type "default" with mrope_section for its vision positions.
    if rope_type not in ("default", "mrope"):
        raise ConfigError(
            f"{where}.rope_type {rope_type!r} is not supported (only default rope is implemented)"
        )
    theta = params.get("rope_theta", d.get("rope_theta", _DEFAULT_ROPE_THETA))
    factor = params.get("partial_rotary_factor", d.get("partial_rotary_factor", _DEFAULT_PARTIAL_ROTARY))
    mrope = params.get("mrope_section")
    try:
        theta, factor = float(theta), float(factor)
    except (TypeError, ValueError):
        raise ConfigError(f"rope_theta / partial_rotary_factor must be numbers, got {theta!r} / {factor!r}") from None
    return theta, factor, (list(mrope) if mrope is not None else None)


def _layer_kinds(d: dict, n_layers: int) -> list[str]:
    kinds = d.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, list):
            raise ConfigError(f"layer_types must be a list, got {kinds!r}")
        return list(kinds)
    interval = d.get("full_attention_interval", _DEFAULT_FULL_ATTENTION_INTERVAL)
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
        raise ConfigError(f"full_attention_interval must be a positive integer, got {interval!r}")
    return [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n_layers)]


def _dtype(d: dict, outer: dict) -> str:
    value = d.get("dtype") or d.get("torch_dtype") or outer.get("dtype") or outer.get("torch_dtype")
    if value is None:
        return "float32"
    value = str(value).removeprefix("torch.")
    if value not in DTYPES:
        raise ConfigError(f"torch_dtype/dtype {value!r} is not one of {', '.join(DTYPES)}")
    return value


def _from_hf_dict(outer: dict[str, Any]) -> HybridConfig:
    model_type = outer.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ConfigError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(MODEL_TYPES)}"
        )
    family = MODEL_TYPES[model_type]
    d = outer
    if model_type == "qwen3_5":
        d = outer.get("text_config")
        if not isinstance(d, dict):
            raise ConfigError("text_config is missing from a qwen3_5 config (needed for the text model)")
        log.warning("qwen3_5 checkpoint: exporting the text model only; the vision tower is not exported")
    hidden_act = d.get("hidden_act", "silu")
    n_layers = _get(d, "num_hidden_layers", family)
    theta, factor, mrope = _rope(d)
    # A composite checkpoint ties on its top-level flag (what transformers' tying reads).
    tie = outer.get("tie_word_embeddings", d.get("tie_word_embeddings"))
    if tie is None:
        tie = _DEFAULTS[family]["tie_word_embeddings"]
    fields = dict(
        family=family,
        model_type=model_type,
        vocab_size=_get(d, "vocab_size", family),
        hidden_size=_get(d, "hidden_size", family),
        intermediate_size=_get(d, "intermediate_size", family),
        num_hidden_layers=n_layers,
        layer_kinds=_layer_kinds(d, n_layers),
        num_attention_heads=_get(d, "num_attention_heads", family),
        num_key_value_heads=_get(d, "num_key_value_heads", family),
        head_dim=_get(d, "head_dim", family),
        attn_output_gate=bool(_get(d, "attn_output_gate", family)),
        attention_bias=bool(_get(d, "attention_bias", family)),
        rope_theta=theta,
        partial_rotary_factor=factor,
        mrope_section=mrope,
        max_position_embeddings=_get(d, "max_position_embeddings", family),
        linear_num_key_heads=_get(d, "linear_num_key_heads", family),
        linear_num_value_heads=_get(d, "linear_num_value_heads", family),
        linear_key_head_dim=_get(d, "linear_key_head_dim", family),
        linear_value_head_dim=_get(d, "linear_value_head_dim", family),
        linear_conv_kernel_dim=_get(d, "linear_conv_kernel_dim", family),
        rms_norm_eps=float(_get(d, "rms_norm_eps", family)),
        tie_word_embeddings=bool(tie),
        hidden_act=hidden_act,
        dtype=_dtype(d, outer),
    )
    if family == "qwen3_next":
        fields.update(
            num_experts=_get(d, "num_experts", family),
            num_experts_per_tok=_get(d, "num_experts_per_tok", family),
            moe_intermediate_size=_get(d, "moe_intermediate_size", family),
            shared_expert_intermediate_size=_get(d, "shared_expert_intermediate_size", family),
            norm_topk_prob=bool(_get(d, "norm_topk_prob", family)),
            decoder_sparse_step=_get(d, "decoder_sparse_step", family),
            mlp_only_layers=list(d.get("mlp_only_layers") or []),
        )
    try:
        return HybridConfig(**fields)
    except TypeError as exc:  # a field of the wrong JSON type reaching a comparison
        raise ConfigError(f"config.json has a field of the wrong type: {exc}") from None
