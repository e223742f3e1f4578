"""Layer kinds: which decoder layers of a HybridForCausalLM trace to the same ONNX subgraph.

A layer's *signature* is everything about it that can change what the exporter writes for it except
the values of its weights: the module tree (child names and classes), the plain attributes of every
module (ints, floats, strings, dtypes, tuples of those: head counts, the projection layout, the FP8
K/V cache scales, which are baked into the graph as constants; a plain tensor by its bytes), the name, shape and dtype of every
parameter and buffer (quantized weights and scales are buffers, so the quant format is in it), and
for each one-element tensor whether it is 0, 1 or neither (the exporter's optimizer rewrites x * 1,
x + 0, x - 0 and x / 1 with a scalar constant away). `layer_idx` is left out: it names the layer and
changes nothing in its graph. Layers with equal signatures form a kind; the kind's representative is
its first layer (`gdn_export.onnx.stamp` traces the representatives only and stamps their subgraph
for the other layers of their kind).

    kinds = layer_kinds(model)          # LayerKinds: kind of every layer, representatives in order
    reduced = reduced_model(model, kinds.representatives)   # the model with those layers only
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass

import torch
from torch import nn

# Module attributes that do not reach the graph: the layer's index (a name), torch's own flags.
IGNORED_ATTRIBUTES = frozenset({"layer_idx", "training"})
# The exporter's optimizer drops a Mul / Div by a scalar 1 and an Add / Sub of a scalar 0
# (onnxscript.rewriter's no-op rules: math.isclose at its Constant pattern's tolerances): a
# one-element weight's closeness to 0 or 1 changes the graph, its value otherwise does not.
_REL_TOL, _ABS_TOL = 1e-5, 1e-8


def scalar_class(value: float) -> str:
    """"zero", "one" or "other": which scalar constant the optimizer's no-op rules take `value` for."""
    for name, target in (("zero", 0.0), ("one", 1.0)):
        if math.isclose(value, target, rel_tol=_REL_TOL, abs_tol=_ABS_TOL):
            return name
    return "other"


@dataclass(frozen=True)
class LayerKinds:
    """kind_of[i]: the kind (index into `signatures`) of layer i; representatives[k]: the first layer of
    kind k, ascending (kinds are numbered in order of their first layer)."""

    signatures: tuple[str, ...]
    kind_of: tuple[int, ...]

    @property
    def representatives(self) -> tuple[int, ...]:
        return tuple(self.kind_of.index(k) for k in range(len(self.signatures)))

    def describe(self) -> str:
        """"2 layer kinds of 60 layers"."""
        n = len(self.signatures)
        return f"{n} layer kind{'s' if n != 1 else ''} of {len(self.kind_of)} layers"


def _attribute(value):
    """A JSON-able form of a module attribute's value: plain values exactly (floats by repr: exact,
    nan and inf included), a tensor by shape, dtype and a digest of its bytes (a tensor that is
    neither parameter nor buffer reaches the graph as a constant), anything else by its type or
    qualified name."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [_attribute(v) for v in value]
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() and not t.is_meta else b""
        return ["tensor", list(t.shape), str(t.dtype), hashlib.sha256(data).hexdigest()]
    name = getattr(value, "__qualname__", None)
    if callable(value) and name:
        return f"<{getattr(value, '__module__', '')}.{name}>"
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def _scalar_class(t: torch.Tensor) -> str | None:
    if t.numel() != 1 or t.is_meta or t.is_complex():
        return None
    return scalar_class(float(t.detach().reshape(()).to(torch.float32).cpu()))


def module_signature(module: nn.Module) -> str:
    """The signature of `module` (see the module docstring) as a JSON string."""
    parts = []
    for path, m in module.named_modules(remove_duplicate=False):
        cls = type(m)
        attrs = {k: _attribute(v) for k, v in sorted(vars(m).items())
                 if not k.startswith("_") and k not in IGNORED_ATTRIBUTES}
        tensors = []
        for kind, table in (("p", m._parameters), ("b", m._buffers)):
            for name, t in table.items():
                if t is None:
                    tensors.append([kind, name, None])
                else:
                    tensors.append([kind, name, list(t.shape), str(t.dtype), _scalar_class(t)])
        parts.append([path, f"{cls.__module__}.{cls.__qualname__}", attrs, tensors])
    return json.dumps(parts, separators=(",", ":"))


def layer_kinds(model) -> LayerKinds:
    """Group the decoder layers of `model` (HybridForCausalLM) by signature."""
    index: dict[str, int] = {}
    kind_of = []
    for layer in model.model.layers:
        sig = module_signature(layer)
        kind_of.append(index.setdefault(sig, len(index)))
    return LayerKinds(tuple(index), tuple(kind_of))


def reduced_model(model, layers) -> nn.Module:
    """A shallow copy of `model` (HybridForCausalLM) whose decoder layers are `layers` (indices, in
    order) of it: the same module objects (no weight is copied), the config's layer list cut to
    them. Its layer j is the model's layer layers[j]."""
    layers = list(layers)
    config = model.config
    cut = dataclasses.replace(config, num_hidden_layers=len(layers),
                              layer_kinds=[config.layer_kinds[i] for i in layers],
                              mlp_only_layers=[j for j, i in enumerate(layers) if i in config.mlp_only_layers])
    reduced = copy.copy(model)
    reduced._modules = dict(model._modules)
    inner = copy.copy(model.model)
    inner._modules = dict(model.model._modules)
    inner._modules["layers"] = nn.ModuleList([model.model.layers[i] for i in layers])
    reduced._modules["model"] = inner
    reduced.config = cut
    return reduced
