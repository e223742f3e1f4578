"""HybridConfig parsing of transformers config.json dicts: fields, defaults and every refusal."""

from __future__ import annotations

import copy
import json
import logging

import pytest

from gdn_export.hf_config import parse_config, read_config
from gdn_export.config import FULL, LINEAR, HybridConfig
from gdn_export.errors import CheckpointError, ConfigError
from gdn_export.weights.tiny import tiny_config_dict


def _text(d: dict) -> dict:
    return d.get("text_config", d)


@pytest.mark.parametrize(
    "family, model_type",
    [("qwen3_next", None), ("qwen3_5", None), ("qwen3_5", "qwen3_5")],
    ids=["qwen3_next", "qwen3_5_text", "qwen3_5-composite"],
)
def test_parses_tiny_configs(family, model_type):
    c = parse_config(tiny_config_dict(family, model_type))
    assert c.family == family
    assert c.layer_kinds == [LINEAR, LINEAR, LINEAR, FULL]
    assert (c.linear_num_key_heads, c.linear_num_value_heads) == (2, 4)
    assert (c.linear_key_head_dim, c.linear_value_head_dim) == (16, 24)
    assert c.conv_dim == 2 * 2 * 16 + 4 * 24
    assert (c.head_dim, c.rotary_dim, c.rope_theta) == (16, 4, 10000.0)
    assert c.num_experts == (4 if family == "qwen3_next" else 0)
    assert [c.is_moe_layer(i) for i in range(4)] == [family == "qwen3_next"] * 4


def test_composite_parses_its_text_config_silently(caplog):
    """Parsing is not exporting: what a command does with a composite checkpoint's vision tower is
    that command's to say (export writes both files; run says it runs the language model alone)."""
    with caplog.at_level(logging.DEBUG):
        c = parse_config(tiny_config_dict("qwen3_5", "qwen3_5"))
    assert c.model_type == "qwen3_5"
    assert caplog.text == ""
    assert c.mrope_section == [1, 1, 0]


def test_explicit_layer_types_win_over_interval():
    kinds = [FULL, LINEAR, FULL, LINEAR]
    c = parse_config(tiny_config_dict("qwen3_5", layer_types=kinds, full_attention_interval=4))
    assert c.layer_kinds == kinds


def test_full_attention_interval():
    c = parse_config(tiny_config_dict("qwen3_5", num_hidden_layers=6, full_attention_interval=3))
    assert c.layer_kinds == [LINEAR, LINEAR, FULL, LINEAR, LINEAR, FULL]


def test_legacy_top_level_rope_fields():
    d = tiny_config_dict("qwen3_next")
    del d["rope_parameters"]
    d.update(rope_theta=1e6, partial_rotary_factor=0.5, rope_scaling=None)
    c = parse_config(d)
    assert (c.rope_theta, c.partial_rotary_factor, c.rotary_dim) == (1e6, 0.5, 8)


def test_moe_layer_rule_follows_transformers():
    c = parse_config(tiny_config_dict("qwen3_next", decoder_sparse_step=2, mlp_only_layers=[3]))
    assert [c.is_moe_layer(i) for i in range(4)] == [False, True, False, False]


def test_composite_ties_on_top_level_flag():
    d = tiny_config_dict("qwen3_5", "qwen3_5")
    d["tie_word_embeddings"] = True
    d["text_config"]["tie_word_embeddings"] = False
    assert parse_config(d).tie_word_embeddings is True


def test_dtype_from_torch_dtype_and_missing_defaults():
    d = tiny_config_dict("qwen3_5")
    del d["dtype"]
    assert parse_config(d).dtype == "float32"
    d["torch_dtype"] = "bfloat16"
    assert parse_config(d).dtype == "bfloat16"
    del d["linear_conv_kernel_dim"]  # transformers' default
    assert parse_config(d).linear_conv_kernel_dim == 4


def test_to_dict_round_trip():
    c = parse_config(tiny_config_dict("qwen3_next", mlp_only_layers=[1]))
    d = json.loads(json.dumps(c.to_dict()))
    assert parse_config(d) == c


def _set(path: str, value):
    def edit(d):
        target = _text(d)
        *parents, leaf = path.split(".")
        for p in parents:
            target = target[p]
        if value is _DELETE:
            del target[leaf]
        else:
            target[leaf] = value
    return edit


_DELETE = object()

BAD = [
    ("value-heads-not-multiple", "qwen3_5", _set("linear_num_value_heads", 3), "linear_num_value_heads"),
    ("rope-yarn", "qwen3_5", _set("rope_parameters.rope_type", "yarn"), "rope_parameters.rope_type"),
    ("rope-dynamic-legacy", "qwen3_next",
     lambda d: (d.pop("rope_parameters"), d.update(rope_scaling={"type": "dynamic", "factor": 2.0})),
     "rope_scaling.rope_type"),
    ("hidden-act-gelu", "qwen3_next", _set("hidden_act", "gelu"), "hidden_act"),
    ("layer-type-sliding", "qwen3_5", _set("layer_types", [LINEAR, "sliding_attention", LINEAR, FULL]),
     "layer_types[1]"),
    ("layer-types-too-short", "qwen3_5", _set("layer_types", [LINEAR, FULL]), "layer_types"),
    ("dtype-int8", "qwen3_5", _set("dtype", "int8"), "dtype"),
    ("gqa-not-multiple", "qwen3_5", _set("num_attention_heads", 3), "num_attention_heads"),
    ("odd-rotary-dim", "qwen3_5", _set("rope_parameters.partial_rotary_factor", 0.1875), "partial_rotary_factor"),
    ("hidden-size-string", "qwen3_5", _set("hidden_size", "64"), "hidden_size"),
    ("top-k-over-experts", "qwen3_next", _set("num_experts_per_tok", 5), "num_experts_per_tok"),
    ("interval-zero", "qwen3_5", _set("full_attention_interval", 0), "full_attention_interval"),
    ("model-type-llama", "qwen3_5", lambda d: d.update(model_type="llama"), "model_type"),
    ("model-type-qwen3_moe", "qwen3_5", lambda d: d.update(model_type="qwen3_moe"), "model_type"),
    ("moe-top-k-over-experts", "qwen3_5_moe", _set("num_experts_per_tok", 5), "num_experts_per_tok"),
    ("moe-mlp-only-layers", "qwen3_5_moe", _set("mlp_only_layers", [1]), "mlp_only_layers"),
    ("moe-no-topk-norm", "qwen3_5_moe", _set("norm_topk_prob", False), "norm_topk_prob"),
    ("moe-sparse-step", "qwen3_5_moe", _set("decoder_sparse_step", 2), "decoder_sparse_step"),
    ("olmo-rope-yarn", "olmo_hybrid", _set("rope_parameters.rope_type", "yarn"), "rope_parameters.rope_type"),
    ("olmo-partial-rope", "olmo_hybrid", _set("rope_parameters.partial_rotary_factor", 0.5),
     "partial_rotary_factor"),
    ("olmo-neg-eigval-string", "olmo_hybrid", _set("linear_allow_neg_eigval", "yes"), "linear_allow_neg_eigval"),
    ("olmo-hidden-act", "olmo_hybrid", _set("hidden_act", "gelu"), "hidden_act"),
    ("olmo-gqa-not-multiple", "olmo_hybrid", _set("num_key_value_heads", 3), "num_attention_heads"),
    # JSON types: a string "false" is truthy, a string number parses in Python; neither is taken
    ("tie-string-false", "qwen3_5", lambda d: d.update(tie_word_embeddings="false"), "tie_word_embeddings"),
    ("gate-string", "qwen3_5", _set("attn_output_gate", "no"), "attn_output_gate"),
    ("bias-string", "qwen3_next", _set("attention_bias", "yes"), "attention_bias"),
    ("topk-norm-int", "qwen3_next", _set("norm_topk_prob", 1), "norm_topk_prob"),
    ("eps-string", "qwen3_5", _set("rms_norm_eps", "1e-6"), "rms_norm_eps"),
    ("eps-negative", "qwen3_5", _set("rms_norm_eps", -1.0), "rms_norm_eps"),
    ("eps-zero", "olmo_hybrid", _set("rms_norm_eps", 0), "rms_norm_eps"),
    ("rope-theta-negative", "qwen3_next", _set("rope_parameters.rope_theta", -5.0), "rope_theta"),
    ("rope-theta-nan", "qwen3_5", _set("rope_parameters.rope_theta", float("nan")), "rope_theta"),
    ("rotary-string", "qwen3_5", _set("rope_parameters.partial_rotary_factor", "0.5"), "partial_rotary_factor"),
    ("olmo-rope-theta-string", "olmo_hybrid", _set("rope_parameters.rope_theta", "x"), "rope_theta"),
    ("layers-negative", "qwen3_5", _set("num_hidden_layers", -1), "num_hidden_layers must be a positive"),
    ("sparse-step-zero", "qwen3_next", _set("decoder_sparse_step", 0), "decoder_sparse_step"),
    ("sparse-step-string", "qwen3_next", _set("decoder_sparse_step", "2"), "decoder_sparse_step"),
    ("mlp-only-string", "qwen3_next", _set("mlp_only_layers", "x"), "mlp_only_layers"),
    ("mlp-only-out-of-range", "qwen3_next", _set("mlp_only_layers", [9]), "mlp_only_layers"),
    ("experts-string", "qwen3_next", _set("num_experts", "4"), "num_experts"),
    ("moe-size-float", "qwen3_next", _set("moe_intermediate_size", 1.5), "moe_intermediate_size"),
]


@pytest.mark.parametrize("family, edit, field", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_unsupported_field_is_config_error_naming_it(family, edit, field):
    d = copy.deepcopy(tiny_config_dict(family))
    edit(d)
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_config(d)


def test_composite_without_text_config():
    d = tiny_config_dict("qwen3_5", "qwen3_5")
    del d["text_config"]
    with pytest.raises(ConfigError, match="text_config"):
        parse_config(d)


def test_from_file_missing_and_invalid(tmp_path):
    with pytest.raises(CheckpointError, match="config.json: config file not found"):
        read_config(tmp_path / "config.json")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config.json: invalid JSON"):
        read_config(bad)


def test_released_qwen3_next_style_config():
    """Field spelling of the released Qwen3-Next config.json (rope at top level, rope_scaling null)."""
    d = {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "torch_dtype": "bfloat16",
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5120, "num_hidden_layers": 48,
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "hidden_act": "silu",
        "rope_theta": 10000000, "rope_scaling": None, "partial_rotary_factor": 0.25,
        "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
        "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "norm_topk_prob": True, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "rms_norm_eps": 1e-06, "tie_word_embeddings": False,
    }
    c = parse_config(d)
    assert (c.dtype, c.rope_theta, c.rotary_dim, c.conv_dim) == ("bfloat16", 1e7, 64, 8192)
    assert c.layer_kinds.count(FULL) == 12 and c.layer_kinds[3] == FULL


def test_released_qwen3_5_style_config():
    """Composite layout: text_config with layer_types and mrope in rope_parameters."""
    text = {
        "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        "attn_output_gate": True, "dtype": "bfloat16", "mtp_num_hidden_layers": 1,
    }
    c = parse_config({"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": False})
    assert (c.family, c.dtype, c.mrope_section, c.rotary_dim) == ("qwen3_5", "bfloat16", [11, 11, 10], 64)
    assert c.num_experts == 0 and c.linear_num_value_heads == 32  # transformers' default


@pytest.mark.parametrize("model_type", ["qwen3_5_moe_text", "qwen3_5_moe"])
def test_qwen3_5_moe_every_layer_is_moe(model_type):
    c = parse_config(tiny_config_dict("qwen3_5_moe", model_type))
    assert (c.family, c.model_type) == ("qwen3_5_moe", model_type)
    assert (c.num_experts, c.num_experts_per_tok, c.norm_topk_prob) == (4, 2, True)
    assert [c.is_moe_layer(i) for i in range(4)] == [True] * 4
    assert c.intermediate_size == 0 and c.zero_centered_norm and c.attn_output_gate
    assert (c.qk_norm, c.attn_block_norm, c.mrope_section) == ("head", "pre", [1, 1, 0])


def test_qwen3_5_moe_defaults_are_transformers():
    c = parse_config({"model_type": "qwen3_5_moe_text"})
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_key_value_heads) == (248320, 2048, 40, 2)
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (256, 8, 512)
    assert c.layer_kinds[:4] == [LINEAR, LINEAR, LINEAR, FULL] and c.rotary_dim == 64


def test_olmo_hybrid_fields():
    c = parse_config(tiny_config_dict("olmo_hybrid"))
    assert (c.family, c.head_dim, c.rotary_dim, c.use_rope) == ("olmo_hybrid", 16, 16, True)
    assert (c.qk_norm, c.attn_block_norm, c.attn_output_gate, c.zero_centered_norm) == (
        "projection", "post", False, False)
    assert c.allow_neg_eigval and c.gdn_norm_eps == 1e-5 and c.rms_norm_eps == 1e-6
    assert c.layer_kinds == [LINEAR, LINEAR, LINEAR, FULL] and c.num_experts == 0


def test_olmo_hybrid_defaults_follow_transformers():
    """OlmoHybridConfig derives the GDN sizes, kv heads and head_dim from other fields."""
    c = parse_config({"model_type": "olmo_hybrid", "num_hidden_layers": 3})
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (3840, 30, 30, 128)
    assert (c.linear_num_key_heads, c.linear_num_value_heads) == (30, 30)
    assert (c.linear_key_head_dim, c.linear_value_head_dim) == (96, 192)
    assert c.layer_kinds == [LINEAR, LINEAR, FULL]  # none at i % 4 == 3: the last one
    assert c.allow_neg_eigval and c.use_rope and c.rope_theta == 10000.0


@pytest.mark.parametrize("edit", [
    lambda d: d.update(rope_parameters={"rope_type": "default", "rope_theta": None}),
    lambda d: (d.pop("rope_parameters"), d.update(rope_theta=None)),
], ids=["rope_parameters", "top-level"])
def test_olmo_hybrid_null_rope_theta_is_nope(edit):
    d = tiny_config_dict("olmo_hybrid")
    edit(d)
    c = parse_config(d)
    assert not c.use_rope
    d = tiny_config_dict("olmo_hybrid", linear_allow_neg_eigval=False)
    d.pop("rope_parameters")
    c = parse_config(d)
    assert c.use_rope and c.rope_theta == 10000.0 and not c.allow_neg_eigval
