"""The flat recurrent-state interface of `HybridForCausalLM` and a small convenience wrapper.

States are one flat tuple in layer order; each layer contributes two tensors:

    linear_attention   past.{i}.conv        [batch, conv_dim, K-1]        model dtype
                       past.{i}.recurrent   [batch, Hv, Dk, Dv]           state dtype (fp32 default)
    full_attention     past.{i}.key         [batch, Hkv, L, head_dim]     model dtype (float8_e4m3fn
                       past.{i}.value       [batch, Hkv, L, head_dim]      with an FP8 K/V cache:
                                                                           gdn_export.modules.kv_cache_fp8)

L is the cache length (static) of the in-place layout, or the dynamic "past" of the concat layout.
The forward pass returns the new states in the same order, named present.{i}.*. "batch" (and "past")
are the dynamic dimensions (ONNX dim names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from gdn_export.errors import InputError

BATCH, PAST = "batch", "past"
KINDS = ("conv", "recurrent", "key", "value")


@dataclass(frozen=True)
class StateSpec:
    """One state tensor: name (past.{layer}.{kind}), shape with "batch"/"past" for dynamic dims."""

    name: str
    shape: tuple[int | str, ...]
    dtype: torch.dtype
    layer: int
    kind: str  # "conv" | "recurrent" | "key" | "value"

    @property
    def output_name(self) -> str:
        """The matching output of forward: present.{layer}.{kind}."""
        return f"present.{self.layer}.{self.kind}"

    def concrete_shape(self, batch: int, past: int = 0) -> tuple[int, ...]:
        """The shape with the dynamic dims filled in."""
        return tuple(batch if d == BATCH else past if d == PAST else d for d in self.shape)

    def zeros(self, batch: int, past: int = 0, device: torch.device | str | None = None) -> torch.Tensor:
        return torch.zeros(self.concrete_shape(batch, past), dtype=self.dtype, device=device)


def check_states(specs: Sequence[StateSpec], states: Sequence[torch.Tensor]) -> None:
    """Raise InputError naming the first state whose count, rank, static dims or dtype is wrong."""
    if len(states) != len(specs):
        raise InputError(f"expected {len(specs)} state tensors ({specs[0].name} ...), got {len(states)}")
    batch = None
    for spec, t in zip(specs, states):
        if t.dim() != len(spec.shape):
            raise InputError(f"{spec.name} must have rank {len(spec.shape)} {spec.shape}, got {tuple(t.shape)}")
        for want, got in zip(spec.shape, t.shape):
            if isinstance(want, int) and want != got:
                raise InputError(f"{spec.name} must be {spec.shape}, got {tuple(t.shape)}")
        batch = t.shape[0] if batch is None else batch
        if t.shape[0] != batch:
            raise InputError(f"{spec.name} has batch {t.shape[0]}, other states have {batch}")
        if spec.kind == "recurrent" and t.dtype != spec.dtype:
            raise InputError(f"{spec.name} must be {str(spec.dtype).removeprefix('torch.')} (the "
                             f"model's recurrent state dtype), got {str(t.dtype).removeprefix('torch.')}")


class Cache:
    """A named view over the flat state list: `cache[layer, "key"]`.

    Purely a convenience for Python callers; the model takes and returns the flat tuple
    (`cache.states`), and `cache.update(new_states)` swaps them in after a step.
    """

    def __init__(self, specs: Sequence[StateSpec], states: Sequence[torch.Tensor]) -> None:
        check_states(specs, states)
        self.specs = list(specs)
        self.states = list(states)
        self._index = {(s.layer, s.kind): i for i, s in enumerate(self.specs)}

    def __getitem__(self, key: tuple[int, str]) -> torch.Tensor:
        return self.states[self._index[key]]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.states)

    def __len__(self) -> int:
        return len(self.states)

    def update(self, new_states: Sequence[torch.Tensor]) -> None:
        check_states(self.specs, new_states)
        self.states = list(new_states)
