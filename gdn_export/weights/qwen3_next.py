"""Qwen3-Next (model_type qwen3_next) checkpoint names.

Checkpoints use the module names directly (model.layers.{i}.linear_attn.in_proj_qkvz.weight, ...),
except for the routed experts, which the model holds stacked as transformers 5 does in memory:

    model.layers.{i}.mlp.experts.gate_up_proj  [E, 2I, hidden]   (gate rows first, then up)
    model.layers.{i}.mlp.experts.down_proj     [E, hidden, I]

Both layouts load: per expert (model.layers.{i}.mlp.experts.{e}.gate_proj|up_proj|down_proj.weight,
as published and as `save_pretrained` writes in transformers 5.x), stacked one layer at a time
into a preallocated tensor (`mapping.stack_experts`), or already stacked under the names above.
Multi-token-prediction tensors (mtp.*) are skipped with a note in the load report (the MTP head
loads on its own: gdn_export.weights.mtp).
"""

from __future__ import annotations

import re
from typing import Iterator

import torch

from gdn_export.config import HybridConfig
from gdn_export.weights.mapping import Plan, build_plan, stack_experts

IGNORE = (re.compile(r"^mtp\."),)
_STACKED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def plan(shapes: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], config: HybridConfig) -> Plan:
    """Match a Qwen3-Next checkpoint's tensors to the model's; CheckpointError names the key."""
    experts = stack_experts(shapes, expected, lambda key: key, config.num_experts) if config.num_experts else {}
    return build_plan(shapes, expected, rename=lambda key: key, ignore=IGNORE, assembled=experts)


def checkpoint_name(module_name: str, config: HybridConfig) -> str:
    """The name a module tensor has in a Qwen3-Next checkpoint (the same)."""
    return module_name


def per_expert(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor), or a stacked expert tensor split into the published per-expert tensors."""
    match = _STACKED.match(name)
    if match is None:
        yield name, tensor
        return
    prefix, which = match[1], match[2]
    for e in range(tensor.shape[0]):
        if which == "down_proj":
            yield f"{prefix}.{e}.down_proj.weight", tensor[e]
        else:
            gate, up = tensor[e].chunk(2, dim=0)
            yield f"{prefix}.{e}.gate_proj.weight", gate
            yield f"{prefix}.{e}.up_proj.weight", up


def checkpoint_tensors(name: str, tensor: torch.Tensor, config: HybridConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint tensors (published layout) that hold module tensor `name`."""
    yield from per_expert(checkpoint_name(name, config), tensor)
