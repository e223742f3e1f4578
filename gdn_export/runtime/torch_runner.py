"""TorchRunner: HybridForCausalLM behind the Runner interface (states are torch tensors)."""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from gdn_export.errors import InputError
from gdn_export.runtime.base import Runner, StateInfo, check_states


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class TorchRunner(Runner):
    """Run `model` (gdn_export.models.hybrid.HybridForCausalLM) on `device`.

    op_backend picks the implementation of the gdn ops ("reference", "triton", "cuda"; default:
    the active one, see gdn_export.ops.backends).
    """

    backend = "torch"

    def __init__(self, model, device: str | torch.device = "cpu", op_backend: str | None = None):
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.op_backend = op_backend
        self.vocab_size = int(model.config.vocab_size)
        self.layout = model.layout
        self.state_specs = [
            StateInfo(s.name, s.output_name, tuple(s.shape), _dtype_name(s.dtype), s.layer, s.kind)
            for s in model.state_specs()
        ]

    def empty_states(self, batch: int) -> list[torch.Tensor]:
        return list(self.model.empty_states(batch, device=self.device))

    def _forward(self, input_ids: np.ndarray, past_lengths: np.ndarray, seq_lens: np.ndarray, states):
        states = self._check_state_tensors(states, input_ids.shape[0], int(past_lengths[0]))
        ids = torch.from_numpy(input_ids).to(self.device)
        past = torch.from_numpy(past_lengths).to(self.device)
        lens = torch.from_numpy(seq_lens).to(self.device)
        logits, new_states = self._call(ids, past, lens, states)
        return logits.float().cpu().numpy(), new_states

    def step(self, ids: torch.Tensor, past: torch.Tensor, lens: torch.Tensor,
             states: list[torch.Tensor]) -> torch.Tensor:
        """One model call on device tensors that leaves the new states in `states` (written in place
        by the model, or copied there), with no host round trip: ids [B, T] int64, past [B] and
        lens [B] int64 on this runner's device, states as `state_specs` for B rows (row slices of
        larger buffers will do, e.g. rows a..b of a pool of model.empty_states(N)). The model runs
        eagerly (GraphRunner's compiled wrapper would compile again for every new shape).
        Unchecked: callers check the lengths on the host first (gdn_export.runtime.base.check_fits).
        Returns the logits, fp32 on the device ([B, 1, V], or [B, T, V] with layout.logits "all")."""
        logits, new_states = self._call(ids, past, lens, states)
        for dst, src in zip(states, new_states):
            if src.data_ptr() != dst.data_ptr():  # a new tensor, not the K/V cache written in place
                dst.copy_(src)
        return logits

    def _check_state_tensors(self, states, batch: int, past: int) -> list[torch.Tensor]:
        """states as a list, or InputError naming the first that is not this runner's kind."""
        states = list(states)
        # States are opaque per backend (runtime/base.py): this runner's are torch tensors, and
        # converting another backend's would hide a mix-up of runners.
        for spec, t in zip(self.state_specs, states):
            if not isinstance(t, torch.Tensor):
                raise InputError(f"state {spec.name} must be a torch.Tensor for the torch runner, got "
                                 f"{type(t).__module__}.{type(t).__qualname__}")
            if t.device != self.model.device:
                raise InputError(f"state {spec.name} is on {t.device}, the model on {self.model.device}")
        check_states(self.state_specs, [(tuple(t.shape), _dtype_name(t.dtype)) for t in states],
                     batch, past)
        return states

    def _backend_context(self):
        """The `use_backend` block of this runner's op backend (a no-op without one)."""
        if self.op_backend is None:
            return contextlib.nullcontext()
        from gdn_export.ops.backends import use_backend

        return use_backend(self.op_backend)

    def _call(self, ids: torch.Tensor, past: torch.Tensor, lens: torch.Tensor, states,
              model=None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One model call on device tensors: (logits, new states). `model` defaults to self.model."""
        # The in-place K/V caches come back as the same tensors, written in place: no per-step copy.
        with torch.no_grad(), self._backend_context():
            logits, *new_states = (self.model if model is None else model)(ids, past, lens, *states)
        return logits, new_states

    def states_to_numpy(self, states) -> dict[str, np.ndarray]:
        out = {}
        for spec, t in zip(self.state_specs, states):
            t = t.detach().cpu()
            # bf16 and float8_e4m3fn (an FP8 K/V cache: the stored e4m3 values, unscaled) as fp32
            out[spec.name] = (t.float() if t.dtype in (torch.bfloat16, torch.float8_e4m3fn) else t).numpy()
        return out
