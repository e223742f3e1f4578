"""OLMo-Hybrid (model_type olmo_hybrid) checkpoint names.

Module names follow transformers' OlmoHybridForCausalLM. Checkpoints may also use the names of the
published OLMo-Hybrid checkpoints, which transformers converts on load (and writes back on save):

    layers.{i}.attention_layer_norm     -> layers.{i}.input_layernorm
    layers.{i}.feedforward_layer_norm   -> layers.{i}.post_attention_layernorm
    linear_attn.q_conv1d / k_conv1d / v_conv1d .weight [n, 1, K], concatenated in that order along
    the channels -> linear_attn.conv1d.weight [C, 1, K] (one depthwise conv over q|k|v: the conv
    state stays one [B, C, K-1] tensor). Published checkpoints split them as q|k|v (Hk*Dk, Hk*Dk,
    Hv*Dv channels); transformers' save_pretrained splits C in three near-equal chunks instead.
    Both concatenate back to the same tensor, so any split whose rows add up to C is accepted.

Multi-token-prediction tensors (mtp.*), if any, are skipped with a note in the load report.
"""

from __future__ import annotations

import re
from typing import Iterator

import torch

from gdn_export.config import LINEAR, HybridConfig
from gdn_export.errors import CheckpointError
from gdn_export.weights.mapping import Plan, Source, build_plan, concat_pieces

IGNORE = (re.compile(r"^(model\.)?mtp\."),)
_RENAMES = (("attention_layer_norm", "input_layernorm"), ("feedforward_layer_norm", "post_attention_layernorm"))
_SPLIT_CONV = re.compile(r"^(.*\.linear_attn)\.(q|k|v)_conv1d\.weight$")


def module_name(key: str) -> str:
    for old, new in _RENAMES:
        key = key.replace(old, new)
    return key


def _split_convs(shapes, expected) -> dict[str, Source]:
    """conv1d.weight of every layer stored as separate q/k/v convs."""
    groups: dict[str, dict[str, str]] = {}
    for key in shapes:
        match = _SPLIT_CONV.match(module_name(key))
        if match:
            groups.setdefault(match[1], {})[match[2]] = key
    sources = {}
    for prefix, keys in sorted(groups.items()):
        name = f"{prefix}.conv1d.weight"
        if name not in expected:
            continue  # not a GDN layer of this config: reported as unexpected
        if name in shapes:
            raise CheckpointError(f"tensor {name} duplicates the separate convs {sorted(keys.values())[0]}, ...")
        spelled = next(iter(keys.values())).rsplit(".", 2)[0]
        for which in "qkv":
            if which not in keys:
                raise CheckpointError(f"tensor {spelled}.{which}_conv1d.weight is missing from the checkpoint")
        sources[name] = concat_pieces(name, [keys[w] for w in "qkv"], shapes, expected[name])
    return sources


def plan(shapes: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], config: HybridConfig) -> Plan:
    """Match an OLMo-Hybrid checkpoint's tensors to the model's; CheckpointError names the key."""
    result = build_plan(shapes, expected, rename=module_name, ignore=IGNORE,
                        checkpoint_name=lambda name: checkpoint_name(name, config),
                        assembled=_split_convs(shapes, expected))
    if not config.use_rope:
        result.notes.append("rope_theta is null: attention without rotary embedding (NoPE)")
    return result


def checkpoint_name(name: str, config: HybridConfig) -> str:
    """The published name of a module tensor (layer norms of the GDN blocks renamed)."""
    match = re.match(r"^model\.layers\.(\d+)\.(input_layernorm|post_attention_layernorm)\.weight$", name)
    if match and config.layer_kinds[int(match[1])] == LINEAR:
        old = "attention_layer_norm" if match[2] == "input_layernorm" else "feedforward_layer_norm"
        return f"model.layers.{match[1]}.{old}.weight"
    return name


def checkpoint_tensors(name: str, tensor: torch.Tensor, config: HybridConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint tensors (published layout) that hold module tensor `name`: GDN convs split
    into q/k/v convs, GDN block norms under their OLMo-core names."""
    if name.endswith(".linear_attn.conv1d.weight"):
        key_dim = config.linear_num_key_heads * config.linear_key_head_dim
        q, k, v = tensor.split([key_dim, key_dim, tensor.shape[0] - 2 * key_dim])
        prefix = name[: -len("conv1d.weight")]
        yield from ((f"{prefix}{w}_conv1d.weight", t) for w, t in zip("qkv", (q, k, v)))
        return
    yield checkpoint_name(name, config), tensor
