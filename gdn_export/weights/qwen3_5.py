"""Qwen3.5 checkpoint names.

* qwen3_5_text (Qwen3_5ForCausalLM): module names as they are (model.layers.{i}..., lm_head.weight).
* qwen3_5 (Qwen3_5ForConditionalGeneration): the text model lives under model.language_model.
  (model.language_model.layers.{i}..., model.language_model.embed_tokens.weight, ...), lm_head.weight
  stays at the top. The vision tower (model.visual.*) and multi-token-prediction tensors (mtp.*) are
  expected extras and ignored.
"""

from __future__ import annotations

import re

from gdn_export.config import HybridConfig
from gdn_export.weights.mapping import Plan, build_plan

IGNORE = (re.compile(r"^(model\.)?visual\."), re.compile(r"^mtp\."))
COMPOSITE_PREFIX = "model.language_model."


def module_name(key: str) -> str:
    if key.startswith(COMPOSITE_PREFIX):
        return "model." + key[len(COMPOSITE_PREFIX):]
    return key


def plan(shapes: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], config: HybridConfig) -> Plan:
    """Match a Qwen3.5 checkpoint's tensors to the model's; CheckpointError names the key."""
    return build_plan(shapes, expected, rename=module_name, ignore=IGNORE,
                      checkpoint_name=lambda name: checkpoint_name(name, config))


def checkpoint_name(name: str, config: HybridConfig) -> str:
    """The name a module tensor has in a checkpoint of config.model_type."""
    if config.model_type == "qwen3_5" and name.startswith("model."):
        return COMPOSITE_PREFIX + name[len("model."):]
    return name
