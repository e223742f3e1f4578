"""Qwen3.5 and Qwen3.5-MoE checkpoint names.

* qwen3_5_text / qwen3_5_moe_text (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM): module names as
  they are (model.layers.{i}..., lm_head.weight).
* qwen3_5 / qwen3_5_moe (the ...ForConditionalGeneration VLMs): the text model lives under
  model.language_model. (model.language_model.layers.{i}..., model.language_model.embed_tokens.weight,
  ...), lm_head.weight stays at the top. The vision tower (model.visual.*) is an expected extra and
  ignored; multi-token-prediction tensors (mtp.*) are skipped with a note in the load report (the
  MTP head loads on its own: gdn_export.weights.mtp).
* Qwen3.5-MoE's routed experts load per expert (as published and as save_pretrained writes) or
  stacked, as for Qwen3-Next (see gdn_export.weights.qwen3_next).
"""

from __future__ import annotations

import re
from typing import Iterator

import torch

from gdn_export.config import COMPOSITE, HybridConfig
from gdn_export.weights.mapping import Plan, build_plan, stack_experts
from gdn_export.weights.qwen3_next import per_expert

IGNORE = (re.compile(r"^(model\.)?visual\."), re.compile(r"^(model\.)?mtp\."))
COMPOSITE_PREFIX = "model.language_model."


def module_name(key: str) -> str:
    if key.startswith(COMPOSITE_PREFIX):
        return "model." + key[len(COMPOSITE_PREFIX):]
    return key


def plan(shapes: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], config: HybridConfig) -> Plan:
    """Match a Qwen3.5 / Qwen3.5-MoE checkpoint's tensors to the model's; CheckpointError names the key."""
    experts = stack_experts(shapes, expected, module_name, config.num_experts) if config.num_experts else {}
    return build_plan(shapes, expected, rename=module_name, ignore=IGNORE,
                      checkpoint_name=lambda name: checkpoint_name(name, config), assembled=experts)


def checkpoint_name(name: str, config: HybridConfig) -> str:
    """The name a module tensor has in a checkpoint of config.model_type."""
    if config.model_type in COMPOSITE and name.startswith("model."):
        return COMPOSITE_PREFIX + name[len("model."):]
    return name


def checkpoint_tensors(name: str, tensor: torch.Tensor, config: HybridConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint tensors (published layout) that hold module tensor `name`."""
    yield from per_expert(checkpoint_name(name, config), tensor)
