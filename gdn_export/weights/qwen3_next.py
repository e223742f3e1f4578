"""Qwen3-Next (model_type qwen3_next) checkpoint names.

Checkpoints use the module names directly (model.layers.{i}.linear_attn.in_proj_qkvz.weight, ...,
model.layers.{i}.mlp.experts.{e}.gate_proj.weight: what `save_pretrained` writes in transformers
5.x). The fused in-memory expert layout of transformers 5 is also accepted:

    model.layers.{i}.mlp.experts.gate_up_proj  [E, 2I, hidden]   (gate rows first, then up)
    model.layers.{i}.mlp.experts.down_proj     [E, hidden, I]

Multi-token-prediction tensors (mtp.*) are expected extras and ignored.
"""

from __future__ import annotations

import re

from gdn_export.config import HybridConfig
from gdn_export.errors import CheckpointError
from gdn_export.weights.mapping import Plan, Source, build_plan, check_shape

IGNORE = (re.compile(r"^mtp\."),)
_FUSED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def _fused_experts(config: HybridConfig):
    E, I, H = config.num_experts, config.moe_intermediate_size, config.hidden_size

    def claim(key: str, shape, expected, plan: Plan) -> bool:
        match = _FUSED.match(key)
        if not match or f"{match[1]}.0.down_proj.weight" not in expected:
            return False
        prefix, which = match[1], match[2]
        if which == "gate_up_proj":
            check_shape(key, shape, (E, 2 * I, H))
            slices = {}
            for e in range(E):
                slices[f"{prefix}.{e}.gate_proj.weight"] = Source(key, lambda t, e=e: t[e, :I])
                slices[f"{prefix}.{e}.up_proj.weight"] = Source(key, lambda t, e=e: t[e, I:])
        else:
            check_shape(key, shape, (E, H, I))
            slices = {f"{prefix}.{e}.down_proj.weight": Source(key, lambda t, e=e: t[e]) for e in range(E)}
        taken = [name for name in slices if name in plan.sources]
        if taken:
            raise CheckpointError(f"tensor {key} duplicates the per-expert tensor {plan.sources[taken[0]].key}")
        plan.sources.update(slices)
        return True

    return claim


def plan(shapes: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], config: HybridConfig) -> Plan:
    """Match a Qwen3-Next checkpoint's tensors to the model's; CheckpointError names the key."""
    return build_plan(shapes, expected, rename=lambda key: key, ignore=IGNORE,
                      fused=_fused_experts(config) if config.num_experts else None)


def checkpoint_name(module_name: str, config: HybridConfig) -> str:
    """The name a module tensor has in a Qwen3-Next checkpoint (the same)."""
    return module_name
