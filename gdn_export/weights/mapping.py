"""Checkpoint-name -> module-name plans shared by the per-family weight modules.

A plan says, for every tensor the model expects, which checkpoint tensor fills it (optionally a
slice of a fused tensor). Building it checks names and shapes from the headers alone; every error
names the checkpoint key and, for shapes, both shapes.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from gdn_export.errors import CheckpointError

log = logging.getLogger("gdn_export.weights")
_MAX_LISTED = 10


@dataclass(frozen=True)
class Source:
    """Where one module tensor comes from: checkpoint `key`, then `select` (e.g. one expert)."""

    key: str
    select: Callable[[torch.Tensor], torch.Tensor] | None = None

    def load(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.select is None else self.select(tensor)


@dataclass
class Plan:
    sources: dict[str, Source] = field(default_factory=dict)  # module name -> source
    ignored: list[str] = field(default_factory=list)  # expected extras (vision tower, MTP)
    unexpected: list[str] = field(default_factory=list)


def check_shape(key: str, got: tuple[int, ...], want: tuple[int, ...]) -> None:
    if tuple(got) != tuple(want):
        raise CheckpointError(f"tensor {key} has shape {tuple(got)} in the checkpoint, expected {tuple(want)}")


def build_plan(
    shapes: dict[str, tuple[int, ...]],
    expected: dict[str, tuple[int, ...]],
    rename: Callable[[str], str],
    ignore: Iterable[re.Pattern],
    fused: Callable[[str, tuple[int, ...], dict[str, tuple[int, ...]], Plan], bool] | None = None,
    checkpoint_name: Callable[[str], str] = lambda name: name,
) -> Plan:
    """Match checkpoint tensors (`shapes`) to module tensors (`expected`).

    rename: checkpoint name -> module name. ignore: patterns of checkpoint names that are
    expected extras. fused(key, shape, expected, plan): claims a fused checkpoint tensor by adding
    its slices to plan.sources and returns True, or returns False. checkpoint_name: module name ->
    the key the checkpoint should have (for the missing-tensor message).
    """
    ignore = list(ignore)
    plan = Plan()
    for key in sorted(shapes):
        name = rename(key)
        if name in expected:
            if name in plan.sources:
                raise CheckpointError(f"tensor {key} and {plan.sources[name].key} both map to {name}")
            check_shape(key, shapes[key], expected[name])
            plan.sources[name] = Source(key)
        elif any(p.search(key) for p in ignore):
            plan.ignored.append(key)
        elif fused is not None and fused(key, shapes[key], expected, plan):
            pass
        else:
            plan.unexpected.append(key)
    missing = [name for name in expected if name not in plan.sources]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"tensor {checkpoint_name(missing[0])} is missing from the checkpoint{more}")
    return plan


def report(plan: Plan, what: str) -> None:
    """Log the ignored extras quietly (a count) and warn about unexpected tensors (listed)."""
    if plan.ignored:
        log.info("%s: ignored %d tensors that gdn-export does not export (%s)",
                 what, len(plan.ignored), plan.ignored[0])
    if plan.unexpected:
        shown = ", ".join(plan.unexpected[:_MAX_LISTED])
        more = f" and {len(plan.unexpected) - _MAX_LISTED} more" if len(plan.unexpected) > _MAX_LISTED else ""
        log.warning("%s: %d unexpected tensors not used by the model: %s%s",
                    what, len(plan.unexpected), shown, more)
