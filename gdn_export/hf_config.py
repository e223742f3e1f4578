"""transformers config.json dict -> `HybridConfig`: per-family defaults, spellings and refusals.

Fields missing from config.json take the defaults of transformers' config classes (Qwen3NextConfig,
Qwen3_5TextConfig, Qwen3_5MoeTextConfig, OlmoHybridConfig), so that a checkpoint means the same
model here as in transformers; a field that cannot be honoured raises ConfigError naming it (see
gdn_export.config for the accepted model types).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gdn_export.config import (
    COMPOSITE,
    DEFAULT_FULL_ATTENTION_INTERVAL,
    DEFAULT_PARTIAL_ROTARY,
    DEFAULT_ROPE_THETA,
    DTYPES,
    FULL,
    LINEAR,
    MODEL_TYPES,
    HybridConfig,
    is_number,
    is_own_dict,
)
from gdn_export.errors import CheckpointError, ConfigError
from gdn_export.paths import check_readable, os_reason


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
    "qwen3_5_moe": {  # Qwen3_5MoeTextConfig: every layer MoE, so no intermediate_size
        **_COMMON_DEFAULTS,
        "vocab_size": 248320, "hidden_size": 2048, "intermediate_size": 0,
        "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2,
        "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
    },
    # OlmoHybridConfig; the linear head counts and sizes, num_key_value_heads and head_dim follow
    # from other fields when absent (see _olmo_fields).
    "olmo_hybrid": {
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "attention_bias": False, "linear_conv_kernel_dim": 4, "max_position_embeddings": 65536,
        "vocab_size": 100352, "hidden_size": 3840, "intermediate_size": 11008,
        "num_hidden_layers": 32, "num_attention_heads": 30, "linear_allow_neg_eigval": True,
    },
}
# OLMo-Hybrid's GDN output norm: transformers hard-codes eps 1e-5 (FLA's FusedRMSNormGated default).
OLMO_GDN_NORM_EPS = 1e-5


# ---------------------------------------------------------------------- transformers dict
def _get(d: dict, name: str, family: str) -> Any:
    value = d.get(name)
    return _DEFAULTS[family][name] if value is None else value


def _number(value: Any, name: str) -> float:
    """A JSON number as float; a string, a bool or a non-finite value is a ConfigError naming it."""
    if not is_number(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    return float(value)


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
    theta = params.get("rope_theta", d.get("rope_theta", DEFAULT_ROPE_THETA))
    factor = params.get("partial_rotary_factor", d.get("partial_rotary_factor", DEFAULT_PARTIAL_ROTARY))
    mrope = params.get("mrope_section")
    theta, factor = _number(theta, "rope_theta"), _number(factor, "partial_rotary_factor")
    if mrope is not None and not isinstance(mrope, list):
        raise ConfigError(f"mrope_section must be a list, got {mrope!r}")
    return theta, factor, (list(mrope) if mrope is not None else None)


def _layer_kinds(d: dict, n_layers: int) -> list[str]:
    kinds = d.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, list):
            raise ConfigError(f"layer_types must be a list, got {kinds!r}")
        return list(kinds)
    interval = d.get("full_attention_interval", DEFAULT_FULL_ATTENTION_INTERVAL)
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


def _olmo_rope(d: dict) -> tuple[bool, float]:
    """(use_rope, rope_theta) of an olmo_hybrid config. transformers skips rope (NoPE) when
    rope_theta is null, as in the released checkpoints, and fills in 10000 when it is absent;
    its default rope rotates whole heads."""
    params = d.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise ConfigError(f"rope_parameters must be an object, got {params!r}")
    params = params or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"rope_parameters.rope_type {rope_type!r} is not supported for olmo_hybrid "
                          f"(only default rope or NoPE)")
    factor = params.get("partial_rotary_factor", d.get("partial_rotary_factor"))
    if factor not in (None, 1, 1.0):
        raise ConfigError(f"partial_rotary_factor {factor!r} is not supported for olmo_hybrid "
                          f"(its rope rotates whole heads)")
    if "rope_theta" in params:
        theta = params["rope_theta"]
    else:
        theta = d.get("rope_theta", DEFAULT_ROPE_THETA) if "rope_theta" in d else DEFAULT_ROPE_THETA
    if theta is None:
        return False, DEFAULT_ROPE_THETA
    if not is_number(theta):
        raise ConfigError(f"rope_theta must be a number or null, got {theta!r}")
    return True, float(theta)


def _olmo_layer_kinds(d: dict, n_layers: int) -> list[str]:
    """OlmoHybridConfig's default: every 4th layer attention, and the last one if none is."""
    if d.get("layer_types") is not None:
        return _layer_kinds(d, n_layers)
    kinds = [FULL if i % 4 == 3 else LINEAR for i in range(n_layers)]
    if FULL not in kinds and kinds:
        kinds[-1] = FULL
    return kinds


def _olmo_fields(d: dict) -> dict[str, Any]:
    """The olmo_hybrid-specific fields, with OlmoHybridConfig's derived defaults."""
    get = lambda name: _get(d, name, "olmo_hybrid")  # noqa: E731
    hidden, heads = get("hidden_size"), get("num_attention_heads")
    n_layers = get("num_hidden_layers")
    try:
        hk = d.get("linear_num_key_heads") or heads
        dk = d.get("linear_key_head_dim") or int(0.75 * hidden / hk)
        fields = dict(
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or hidden // heads,
            linear_num_key_heads=hk,
            linear_num_value_heads=d.get("linear_num_value_heads") or heads,
            linear_key_head_dim=dk,
            linear_value_head_dim=d.get("linear_value_head_dim") or 2 * dk,
        )
    except (TypeError, ZeroDivisionError) as exc:
        raise ConfigError(f"hidden_size / num_attention_heads / linear_num_key_heads must be positive "
                          f"integers ({exc})") from None
    use_rope, theta = _olmo_rope(d)
    allow_neg = d.get("linear_allow_neg_eigval", True)
    if not isinstance(allow_neg, bool):
        raise ConfigError(f"linear_allow_neg_eigval must be true or false, got {allow_neg!r}")
    fields.update(
        layer_kinds=_olmo_layer_kinds(d, n_layers), attn_output_gate=False, qk_norm="projection",
        attn_block_norm="post", use_rope=use_rope, rope_theta=theta, partial_rotary_factor=1.0,
        mrope_section=None, allow_neg_eigval=allow_neg, linear_norm_eps=OLMO_GDN_NORM_EPS,
        zero_centered_norm=False,
    )
    return fields


# Qwen3.5-MoE fixes what Qwen3-Next configures: every layer is MoE, top-k always renormalised.
_QWEN3_5_MOE_FIXED = {"decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True}


def _moe_fields(d: dict, family: str) -> dict[str, Any]:
    get = lambda name: _get(d, name, family)  # noqa: E731
    fields = dict(
        num_experts=get("num_experts"), num_experts_per_tok=get("num_experts_per_tok"),
        moe_intermediate_size=get("moe_intermediate_size"),
        shared_expert_intermediate_size=get("shared_expert_intermediate_size"),
    )
    if family == "qwen3_next":
        fields.update(norm_topk_prob=get("norm_topk_prob"), decoder_sparse_step=get("decoder_sparse_step"),
                      mlp_only_layers=d.get("mlp_only_layers") or [])
        return fields
    for name, fixed in _QWEN3_5_MOE_FIXED.items():
        if d.get(name) is not None and d[name] != fixed:
            raise ConfigError(f"{name} = {d[name]!r} is not supported for qwen3_5_moe (its transformers "
                              f"model has {name} = {fixed!r})")
    fields.update(_QWEN3_5_MOE_FIXED, mlp_only_layers=[])
    return fields


def from_hf_dict(outer: dict[str, Any]) -> HybridConfig:
    """Parse a transformers config.json dict."""
    model_type = outer.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ConfigError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(MODEL_TYPES)}"
        )
    family = MODEL_TYPES[model_type]
    d = outer
    if model_type in COMPOSITE:
        d = outer.get("text_config")
        if not isinstance(d, dict):
            raise ConfigError(f"text_config is missing from a {model_type} config (needed for the text model)")
    hidden_act = d.get("hidden_act", "silu")
    n_layers = _get(d, "num_hidden_layers", family)
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
        attention_bias=_get(d, "attention_bias", family),
        max_position_embeddings=_get(d, "max_position_embeddings", family),
        linear_conv_kernel_dim=_get(d, "linear_conv_kernel_dim", family),
        rms_norm_eps=_number(_get(d, "rms_norm_eps", family), "rms_norm_eps"),
        tie_word_embeddings=tie,
        hidden_act=hidden_act,
        dtype=_dtype(d, outer),
    )
    if family == "olmo_hybrid":
        fields.update(_olmo_fields(d))
    else:
        theta, factor, mrope = _rope(d)
        fields.update(
            layer_kinds=_layer_kinds(d, n_layers),
            num_attention_heads=_get(d, "num_attention_heads", family),
            num_key_value_heads=_get(d, "num_key_value_heads", family),
            head_dim=_get(d, "head_dim", family),
            attn_output_gate=_get(d, "attn_output_gate", family),
            rope_theta=theta,
            partial_rotary_factor=factor,
            mrope_section=mrope,
            linear_num_key_heads=_get(d, "linear_num_key_heads", family),
            linear_num_value_heads=_get(d, "linear_num_value_heads", family),
            linear_key_head_dim=_get(d, "linear_key_head_dim", family),
            linear_value_head_dim=_get(d, "linear_value_head_dim", family),
        )
    if family == "olmo_hybrid":
        fields["num_attention_heads"] = _get(d, "num_attention_heads", family)
    if family in ("qwen3_next", "qwen3_5_moe"):
        fields.update(_moe_fields(d, family))
    if family != "olmo_hybrid":  # the families that publish an MTP head (absent: none)
        fields.update(mtp_num_hidden_layers=d.get("mtp_num_hidden_layers") or 0,
                      mtp_use_dedicated_embeddings=d.get("mtp_use_dedicated_embeddings") or False)
    try:
        return HybridConfig(**fields)
    except TypeError as exc:  # a field of the wrong JSON type reaching a comparison
        raise ConfigError(f"config.json has a field of the wrong type: {exc}") from None


def parse_config(d: dict[str, Any]) -> HybridConfig:
    """A transformers config.json dict, or the output of `HybridConfig.to_dict`, as a HybridConfig."""
    if not isinstance(d, dict):
        raise ConfigError(f"config must be a JSON object, got {type(d).__name__}")
    return HybridConfig.from_dict(d) if is_own_dict(d) else from_hf_dict(d)


def read_config(path: str | Path) -> HybridConfig:
    """Read a config.json; a missing or malformed file is a CheckpointError naming it."""
    path = Path(path)
    check_readable(path, "config file", error=CheckpointError, missing="{path}: config file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read config ({os_reason(exc)})") from None
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                              f"offset {exc.start}); config.json must be UTF-8 JSON") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno})") from None
    try:
        return parse_config(d)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
