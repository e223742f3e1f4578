"""Backend registry for the `gdn` custom ops.

Every backend implements the same three functions with the same argument order as the
`torch.ops.gdn.*` ops (see `gdn_export.ops.gated_delta_rule`, `.causal_conv1d` and `.moe`):

    gated_delta_rule(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens)
        -> (o, final_state)
    causal_conv1d(x, weight, bias, conv_state, silu, seq_lens=None) -> (y, new_conv_state)
    moe(hidden, router_logits, gate_up, down, top_k, norm_topk_prob) -> out

Backends:
    reference  fp32 PyTorch (`naive.py` beside each op); runs anywhere
    triton     the Triton kernels (kernels/<op>/triton/) through each op's triton.py; CUDA tensors, or CPU under TRITON_INTERPRET=1
    cuda       our CUDA kernels (kernels/<op>/cuda/) built as a PyTorch extension (gdn_export.cuda.extension), their
               wrappers beside each op (gdn_export/ops/<op>/cuda.py); CUDA tensors

The active backend is, in order: the innermost `use_backend(...)` block, the environment variable
GDN_EXPORT_BACKEND, then "reference". The ops check the device of their tensors against it
(`check_device`): CPU tensors through a GPU-only backend are a one-line GdnExportError, not a
compiler traceback.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from gdn_export.errors import GdnExportError

ENV_VAR = "GDN_EXPORT_BACKEND"
DEFAULT = "reference"
# The eager glue kernels (gdn_export.ops.rms_norm, .silu_mul, .gated_delta_rule.gating, .rotary): on unless
# GDN_EXPORT_FUSED_KERNELS=0 (their PyTorch forms everywhere, for side-by-side timings).
FUSED = os.environ.get("GDN_EXPORT_FUSED_KERNELS", "1") != "0"


@dataclass(frozen=True)
class Backend:
    name: str
    gated_delta_rule: Callable
    causal_conv1d: Callable
    moe: Callable
    # optional: (q, k, v, g, beta, state, scale, use_qk_l2norm) -> o, the state updated in place
    gated_delta_rule_inplace: Callable | None = None
    # optional fast entries of the eager ops: the same arguments (scale a float), the inputs' checks
    # left to compiled code; None back where the checked entries above must run instead
    gated_delta_rule_fast: Callable | None = None
    gated_delta_rule_inplace_fast: Callable | None = None
    # optional: the same arguments as gated_delta_rule less cu_seqlens -> (o, every token's state)
    # (gdn_export.ops.gated_delta_rule.steps; without it, one call per token)
    gated_delta_rule_steps: Callable | None = None


# name -> module that defines `gated_delta_rule`, `causal_conv1d` and `moe`; imported on first use so
# that a machine without Triton or a CUDA compiler can still use the reference backend.
_MODULES = {
    "reference": "gdn_export.ops.reference_backend",
    "triton": "gdn_export.ops.triton_backend",
    "cuda": "gdn_export.ops.cuda_backend",
}
_LOADED: dict[str, Backend] = {}
# GPU-only backends -> what to do instead on CPU tensors. Triton's interpreter runs its kernels on
# the CPU (kernels/ tests rely on it); our CUDA kernels have no such mode.
_CPU_WORKAROUND = {
    "triton": "use the reference backend or set TRITON_INTERPRET=1",
    "cuda": "use the reference backend",
}
_ACTIVE: contextvars.ContextVar[str | None] = contextvars.ContextVar("gdn_backend", default=None)


def names() -> list[str]:
    """The backend names that can be asked for."""
    return list(_MODULES)


def register(name: str, module: str) -> None:
    """Register (or replace) a backend implemented by `module`."""
    _MODULES[name] = module
    _LOADED.pop(name, None)


def current_name() -> str:
    name = _ACTIVE.get() or os.environ.get(ENV_VAR) or DEFAULT
    if name not in _MODULES:
        raise GdnExportError(f"unknown gdn backend {name!r}; choose one of {', '.join(_MODULES)}")
    return name


def get(name: str | None = None) -> Backend:
    """The backend called `name` (default: the active one), imported on first use."""
    name = name or current_name()
    if name not in _MODULES:
        raise GdnExportError(f"unknown gdn backend {name!r}; choose one of {', '.join(_MODULES)}")
    if name not in _LOADED:
        try:
            module = importlib.import_module(_MODULES[name])
        except ImportError as exc:
            raise GdnExportError(f"gdn backend {name!r} is not available here: {exc}") from exc
        _LOADED[name] = Backend(name, module.gated_delta_rule, module.causal_conv1d, module.moe,
                                getattr(module, "gated_delta_rule_inplace", None),
                                getattr(module, "gated_delta_rule_fast", None),
                                getattr(module, "gated_delta_rule_inplace_fast", None),
                                getattr(module, "gated_delta_rule_steps", None))
    return _LOADED[name]


def _triton_interprets() -> bool:
    try:
        from triton import knobs
    except ImportError:
        return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
    return bool(knobs.runtime.interpret)


def check_device(name: str, device) -> None:
    """GdnExportError when backend `name` cannot run on tensors on `device` (a torch.device):
    triton and cuda need CUDA tensors, except triton under TRITON_INTERPRET=1."""
    if device.type != "cpu" or name not in _CPU_WORKAROUND:
        return
    if name == "triton" and _triton_interprets():
        return
    raise GdnExportError(f"gdn backend {name!r} needs CUDA tensors (got {device.type}); "
                         f"{_CPU_WORKAROUND[name]}")


def for_device(device) -> Backend:
    """The active backend, after `check_device` said it can run on `device` (checked before the
    backend is imported: a CPU-only machine never loads kernels it cannot run)."""
    name = current_name()
    check_device(name, device)
    return get(name)


def exporting() -> bool:
    """True only under torch.export (the ONNX exporter); False in eager mode and inside torch.compile.
    Dynamo before torch 2.12 folds torch.compiler.is_exporting() to True while compiling, which sent
    the compiled runner down the export-only paths: the functional K/V cache update, a copy of every
    cache per call (the 1.66B model at batch 32 on torch 2.11: 2.8 GB more at the prefill's peak,
    1.3 GB more at setup). The flag torch.export sets is read instead, a global dynamo guards on."""
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    return torch.compiler.is_exporting() if flag is None else bool(flag)


def loaded_for(device) -> Backend | None:
    """The active backend when it is already imported and runs on `device` (a CUDA one), else None:
    the ops' fast entries are looked up here without raising (errors come from the checked path)."""
    if device.type == "cpu":
        return None
    return _LOADED.get(_ACTIVE.get() or os.environ.get(ENV_VAR) or DEFAULT)


def can_call_directly(*tensors) -> bool:
    """True when an op may call its backend without the torch.ops dispatcher: eager mode, plain
    tensors. The dispatcher's path into a Python custom op costs tens of microseconds per call (more
    than a decode step's kernel); torch.compile, torch.export (the ONNX exporter), jit tracing and
    dispatch modes (FakeTensor, make_fx) must see each op as its one node, so they keep it."""
    if torch.compiler.is_compiling() or exporting() or torch.jit.is_tracing():
        return False
    if _get_current_dispatch_mode() is not None:
        return False
    for t in tensors:
        if t is not None and type(t) is not torch.Tensor:
            return False
    return True


def on_gpu(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


def fused_eager(x: torch.Tensor, *others, params: tuple = ()) -> bool:
    """Whether an op with a fused eager kernel (rms_norm, silu_mul, gdn_gating, rotary, output_gate) takes it for x and
    `others` (tensors or None) and its module's `params`: `FUSED`, x on a GPU (`on_gpu`), a backend
    other than "reference" active (triton, cuda: what the fast runtime runs), `can_call_directly` on x
    and `others` (eager mode, plain tensors: traces and torch.compile keep the PyTorch form), and no
    gradient asked for (the kernels have no backward: with grad enabled and any input or parameter
    requiring it, the PyTorch form runs). The op checks shapes and dtypes."""
    if not FUSED or not on_gpu(x) or current_name() == "reference":
        return False
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, *others, *params)):
        return False
    return can_call_directly(x, *others)


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[Backend]:
    """Run the `gdn` ops through backend `name` inside the block."""
    backend = get(name)
    token = _ACTIVE.set(name)
    try:
        yield backend
    finally:
        _ACTIVE.reset(token)
