"""Checkpoint-name -> module-name plans shared by the per-family weight modules.

A plan says, for every tensor the model expects, which checkpoint tensor fills it (optionally a
slice of a fused tensor), or which several checkpoint tensors are written into it (`Assembled`:
per-expert tensors stacked, separate q/k/v convs concatenated). Building it checks names and
shapes from the headers alone; every error names the checkpoint key and, for shapes, both shapes.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import torch

from gdn_export.errors import CheckpointError

log = logging.getLogger("gdn_export.weights")
_MAX_LISTED = 10


@dataclass(frozen=True)
class Source:
    """Where one module tensor comes from: checkpoint `key`, then `select` (e.g. one expert)."""

    key: str
    select: Callable[[torch.Tensor], torch.Tensor] | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.key,)

    def load(self, reader, read: Callable[[str], torch.Tensor], dtype: torch.dtype,
             device: torch.device | str) -> torch.Tensor:
        """The module tensor in `dtype` on `device`; read(key) gives a checkpoint tensor, `reader`
        is the CheckpointReader (for read_into)."""
        tensor = read(self.key)
        tensor = tensor if self.select is None else self.select(tensor)
        return tensor.to(device=device, dtype=dtype).contiguous()


@dataclass(frozen=True)
class Assembled(Source):
    """A module tensor of `shape` written piece by piece into one preallocated tensor:
    out[index] = checkpoint tensor `key` for each (key, index) of `pieces`. Only one piece is held
    besides the result, so stacking E experts never holds two copies of a layer's experts."""

    shape: tuple[int, ...] = ()
    pieces: tuple[tuple[str, tuple], ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(key for key, _ in self.pieces)

    def load(self, reader, read, dtype, device) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=dtype, device=device)
        for key, index in self.pieces:
            piece = out[index]
            if piece.is_contiguous() and out.device.type == "cpu":
                reader.read_into(key, piece)  # no mmap pages or temporary left behind
            else:
                piece.copy_(read(key))
        return out


@dataclass
class Plan:
    sources: dict[str, Source] = field(default_factory=dict)  # module name -> source
    ignored: list[str] = field(default_factory=list)  # expected extras (vision tower, MTP)
    unexpected: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # said once in the load report


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
    assembled: dict[str, Source] | None = None,
) -> Plan:
    """Match checkpoint tensors (`shapes`) to module tensors (`expected`).

    rename: checkpoint name -> module name. ignore: patterns of checkpoint names that are
    expected extras. fused(key, shape, expected, plan): claims a fused checkpoint tensor by adding
    its slices to plan.sources and returns True, or returns False. checkpoint_name: module name ->
    the key the checkpoint should have (for the missing-tensor message). assembled: module tensors
    already planned from several checkpoint tensors (see `stack_experts`); their keys are taken.
    """
    ignore = list(ignore)
    plan = Plan(sources=dict(assembled or {}))
    taken = {key: name for name, source in plan.sources.items() for key in source.keys}
    for key in sorted(shapes):
        if key in taken:
            continue
        name = rename(key)
        if name in expected:
            if name in plan.sources:
                raise CheckpointError(f"tensor {key} and {plan.sources[name].key} both give {name}")
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


MTP = re.compile(r"^(model\.)?mtp\.")


def report(plan: Plan, what: str) -> None:
    """Log the ignored extras quietly (a count; multi-token-prediction tensors with their own
    note), the plan's notes, and warn about unexpected tensors (listed)."""
    mtp = [key for key in plan.ignored if MTP.search(key)]
    other = [key for key in plan.ignored if not MTP.search(key)]
    if mtp:
        log.info("%s: skipped %d multi-token-prediction tensors (%s); the next-token model does not "
                 "use them (speculative decoding loads them as its draft head)", what, len(mtp), mtp[0])
    if other:
        log.info("%s: ignored %d tensors that gdn-export does not export (%s)",
                 what, len(other), other[0])
    for note in plan.notes:
        log.info("%s: %s", what, note)
    if plan.unexpected:
        shown = ", ".join(plan.unexpected[:_MAX_LISTED])
        more = f" and {len(plan.unexpected) - _MAX_LISTED} more" if len(plan.unexpected) > _MAX_LISTED else ""
        log.warning("%s: %d unexpected tensors not used by the model: %s%s",
                    what, len(plan.unexpected), shown, more)


# ---------------------------------------------------------------------- routed experts
_PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_ROUTER = re.compile(r"\.mlp\.gate\.weight$")


def stack_experts(
    shapes: dict[str, tuple[int, ...]],
    expected: dict[str, tuple[int, ...]],
    rename: Callable[[str], str],
    num_experts: int,
) -> dict[str, Source]:
    """Plan the stacked expert tensors (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj`
    [E, H, I]) of every layer stored per expert (`experts.{e}.gate_proj|up_proj|down_proj.weight`,
    as published and as transformers' save_pretrained writes). Layers stored stacked map by name
    in `build_plan`. Also checks every router (`mlp.gate.weight`) against num_experts.

    CheckpointError names the key: a router whose rows are not num_experts, an expert index
    >= num_experts, a missing or mis-shaped expert tensor, or a layer stored both ways.
    """
    E = num_experts
    groups: dict[str, dict[tuple[str, int], str]] = {}  # module prefix -> (proj, e) -> key
    for key in sorted(shapes):
        name = rename(key)
        if _ROUTER.search(name) and name in expected and shapes[key] and shapes[key][0] != E:
            raise CheckpointError(f"router {key} has {shapes[key][0]} rows (experts) but num_experts is {E}")
        match = _PER_EXPERT.match(name)
        if not match or f"{match[1]}.gate_up_proj" not in expected:
            continue
        prefix, e, proj = match[1], int(match[2]), match[3]
        if e >= E:
            raise CheckpointError(f"tensor {key} is expert {e}, but num_experts is {E} (experts 0..{E - 1})")
        groups.setdefault(prefix, {})[(proj, e)] = key

    sources: dict[str, Source] = {}
    for prefix, keys in groups.items():
        E_, I2, H = expected[f"{prefix}.gate_up_proj"]
        I = I2 // 2
        some = next(iter(keys.values()))
        # The checkpoint's spelling of this layer's expert keys, for the missing-key message.
        spelled = some[: some.rindex(".experts.") + len(".experts.")]
        for stacked in ("gate_up_proj", "down_proj"):
            both = [k for k in shapes if rename(k) == f"{prefix}.{stacked}"]
            if both:
                raise CheckpointError(f"tensor {both[0]} duplicates the per-expert tensors {spelled}*")
        gate_up, down = [], []
        for e in range(E):
            for proj, want in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                key = keys.get((proj, e))
                if key is None:
                    raise CheckpointError(f"tensor {spelled}{e}.{proj}.weight is missing from the checkpoint "
                                          f"(expert {e} of {E})")
                check_shape(key, shapes[key], want)
            gate_up += [(keys[("gate_proj", e)], (e, slice(0, I))), (keys[("up_proj", e)], (e, slice(I, I2)))]
            down.append((keys[("down_proj", e)], (e,)))
        sources[f"{prefix}.gate_up_proj"] = Assembled(gate_up[0][0], shape=(E, I2, H), pieces=tuple(gate_up))
        sources[f"{prefix}.down_proj"] = Assembled(down[0][0], shape=(E, H, I), pieces=tuple(down))
    return sources


def concat_pieces(name: str, keys: Sequence[str], shapes: dict[str, tuple[int, ...]],
                  want: tuple[int, ...]) -> Assembled:
    """Module tensor `name` of shape `want` as the checkpoint tensors `keys` concatenated along
    axis 0 (their other axes must match `want`'s, and their rows add up to want[0])."""
    pieces, row = [], 0
    for key in keys:
        shape = tuple(shapes[key])
        if shape[1:] != tuple(want[1:]):
            raise CheckpointError(f"tensor {key} has shape {shape} in the checkpoint, expected "
                                  f"(n, {', '.join(map(str, want[1:]))}) to form {name} {tuple(want)}")
        pieces.append((key, (slice(row, row + shape[0]),)))
        row += shape[0]
    if row != want[0]:
        raise CheckpointError(f"tensors {', '.join(keys)} have {row} rows together, expected {want[0]} "
                              f"to form {name} {tuple(want)}")
    return Assembled(keys[0], shape=tuple(want), pieces=tuple(pieces))
