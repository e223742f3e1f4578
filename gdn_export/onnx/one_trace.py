"""One trace per export: torch.onnx's second trace (run_decompositions) skipped where it would change
nothing that ONNX sees.

torch.onnx.export(..., dynamo=True) traces a module twice: torch.export.export gives the training IR,
then `ExportedProgram.run_decompositions` traces that graph again to functionalize it and to
decompose what the ONNX registry cannot translate. Our models' training IR is already functional
and translatable but for a few ops the dispatcher always decomposes, each into one call: `reshape`
(-> view, translated as a Reshape with allowzero), `chunk` (-> split), `to.dtype` (-> _to_copy),
`&` / `|` of masks (-> bitwise_and / or), the `detach_` of a constant made in forward (-> detach).
`skip_redundant_decomposition()` makes torch.onnx rewrite those as their decomposition does and
skip the second trace, for a program `plan` passes; any other program (an op that mutates its
input, a higher-order op, a reshape to -1 over dynamic dims, another decomposed op) is decomposed as
before, and the reason logged at INFO. The second trace cost 1.6-2.4 s of a 4-layer export's
~9 s on a 2-core CPU (2026-12-08). tests/onnx/test_stamp.py compares the graphs of the two paths
node for node for every family, 16-bit and quantized models and the vision-language language graph;
tests/onnx/test_one_trace.py the vision tower, each rewrite and each refusal. A traced `-1` over
dynamic dims needs the second trace, so model code spells row counts out.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import os
import threading

import torch

# The exporter drops these after decomposition (torch.onnx _fx_passes.remove_assertion_nodes).
_ASSERTIONS = frozenset({
    "aten::sym_constrain_range_for_size", "aten::_assert_async", "aten::_assert_scalar",
    "aten::_assert_tensor_metadata",
})
_LOCK = threading.Lock()
# False: every export decomposes (torch.onnx's own path); the tests compare the two.
ENABLED = True
ENV = "GDN_EXPORT_ONE_TRACE"


def enabled() -> bool:
    """Whether exports skip the second trace where they can: ENABLED, unless $GDN_EXPORT_ONE_TRACE
    is 0 (torch.onnx's own path for every program)."""
    return ENABLED and os.environ.get(ENV, "1").strip() != "0"


def _retarget(node: torch.fx.Node):
    """(target, args, kwargs) the decomposition gives for `node` where it is one call: chunk ->
    split by a static size, to.dtype -> _to_copy, & / | of tensors -> bitwise_and / or, the
    in-place detach_ of a fresh constant -> detach, a reshape to a shape with -1 -> the shape with
    that dim inferred (static). None for anything else."""
    aten = torch.ops.aten
    target, args, kwargs = node.target, node.args, node.kwargs
    if target is aten.reshape.default and len(args) == 2 and not kwargs and -1 in args[1]:
        # The decomposition infers the -1 (a number: the output's dim there must be static).
        out = node.meta["val"].shape if "val" in node.meta else None
        inferred = out[list(args[1]).index(-1)] if out is not None else None
        if isinstance(inferred, int):
            return target, (args[0], [inferred if d == -1 else d for d in args[1]]), {}
        return None
    if target is aten.detach_.default and isinstance(args[0], torch.fx.Node) \
            and args[0].target is aten.lift_fresh_copy.default and len(args[0].users) == 1:
        # torch.tensor(...) in forward: a fresh copy of a constant, detached in place; nothing else sees it
        return aten.detach.default, args, kwargs
    if target in (aten.__and__.Tensor, aten.__or__.Tensor):
        return (aten.bitwise_and.Tensor if target is aten.__and__.Tensor else aten.bitwise_or.Tensor), args, kwargs
    if target is aten.to.dtype and len(args) == 2 and not kwargs:
        return aten._to_copy.default, (args[0],), {"dtype": args[1]}
    if target is aten.chunk.default and len(args) == 3 and not kwargs:
        x, chunks, dim = args
        size = x.meta["val"].shape[dim] if isinstance(x, torch.fx.Node) and "val" in x.meta else None
        if isinstance(size, int) and isinstance(chunks, int) and size % chunks == 0:
            return aten.split.Tensor, (x, size // chunks, dim), {}
    return None


# {op torch.onnx always decomposes: the op whose translation it gets here}: reshape decomposes to
# view (or to a contiguous clone, an Identity in ONNX, and _unsafe_view), both translated as a
# Reshape with allowzero, so that a runtime 0 in the shape stays 0 (torchlib's translation of
# reshape itself lacks it).
_TRANSLATED_AS = {torch.ops.aten.reshape.default: torch.ops.aten.view.default}


def _decomposed_anyway(target) -> bool:
    """Whether run_decompositions replaces `target` even where ONNX translates it: an op with a
    CompositeImplicitAutograd kernel that torch.export's default table does not list (reshape,
    chunk, to.dtype: the dispatcher decomposes those), where linear (listed) is kept."""
    return (torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), torch._C.DispatchKey.CompositeImplicitAutograd)
            and target not in _default_decompositions())


@functools.lru_cache(maxsize=1)
def _default_decompositions() -> frozenset:
    return frozenset(torch.export.default_decompositions().keys())


def plan(program: torch.export.ExportedProgram, registry) -> tuple[str | None, dict]:
    """(why `program`, torch.export's training IR, must go through run_decompositions before
    translation, or None; {node: (target, args, kwargs)} to rewrite when it need not). None when
    translating it as it is, with the few ops the decomposition would replace by one call replaced
    so (`_retarget`), gives what translating its decomposition gives: one graph (no higher-order op,
    no submodule), no op that mutates its input, and every call an op that decomposition keeps and
    the registry translates, an assertion the exporter removes, or operator.getitem."""
    gm = program.graph_module
    rewrites = {}
    if any(isinstance(m, torch.fx.GraphModule) for name, m in gm.named_modules() if name):
        return "a subgraph (higher-order op)", rewrites
    for node in gm.graph.nodes:
        if node.op == "get_attr" and isinstance(getattr(gm, str(node.target), None), torch.nn.Module):
            return f"a submodule {node.target}", rewrites
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            if target._schema.name in _ASSERTIONS:
                continue
            new = _retarget(node)
            if new is not None:
                rewrites[node] = new
                target = new[0]
            elif target is torch.ops.aten.reshape.default and -1 in node.args[1]:
                return "a reshape to -1 over a dynamic dim", rewrites
            if target._schema.is_mutable:
                return f"{target} mutates its input", rewrites
            if target in _TRANSLATED_AS:
                target = _TRANSLATED_AS[target]
            elif _decomposed_anyway(target):
                return f"{target} is decomposed", rewrites
        elif isinstance(target, torch._ops.HigherOrderOperator):
            return f"higher-order op {target}", rewrites
        if not registry.is_registered(target):
            return f"no translation of {target}", rewrites
    return None, rewrites


@contextlib.contextmanager
def skip_redundant_decomposition(log=None):
    """Within: torch.onnx.export skips run_decompositions for a program `plan` passes, its few
    rewrites made. log(reason) is called when a program is decomposed anyway. Exports in other
    threads wait. A torch whose exporter lacks the hook (torch.onnx._internal.exporter._fx_passes.
    decompose_with_registry) exports as usual."""
    try:
        from torch.onnx._internal.exporter import _fx_passes
        original = _fx_passes.decompose_with_registry
    except (ImportError, AttributeError):
        yield
        return

    def decompose(program, registry, *args, **kwargs):
        reason, rewrites = plan(program, registry)
        if reason is not None:
            if log is not None:
                log(reason)
            return original(program, registry, *args, **kwargs)
        for node, (target, new_args, new_kwargs) in rewrites.items():
            node.target, node.args, node.kwargs = target, new_args, new_kwargs
        program.graph_module.recompile()
        for target, substitute in _TRANSLATED_AS.items():
            meta = next(m for m in registry.get_decomps(substitute) if not m.is_complex)
            registry.register_op(target, meta.onnx_function)
        return program

    with _LOCK:
        _fx_passes.decompose_with_registry = decompose
        try:
            yield
        finally:
            _fx_passes.decompose_with_registry = original
