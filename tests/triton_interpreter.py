"""Triton kernels on CPU tensors, under Triton's interpreter, where no CUDA GPU is present.

`triton.jit` chooses between compiling and interpreting when a kernel is defined, so
`interpret_without_gpu()` must run before any Triton kernel is imported (the conftest.py of the
folders whose tests run kernels calls it).

It also makes the interpreter's patching of `triton.language` cheaper, without changing what it
does. The interpreter swaps every builtin of `triton.language` (and of `tl.tensor`, `tl.math`,
`tl.core`) for an interpreting one at each kernel launch and again at each call of a `@triton.jit`
device function, `tl.sum`, `tl.max` and `tl.argmax` included; it finds them each time with
`inspect.getmembers` over the whole module, a third of the interpreted run time of the MoE and
gated-delta-rule kernels (Triton 3.9, 2-core CPU). Here the names of a module's builtins are listed
once (a module's attributes do not change, apart from this patching) and each call patches those of
them that are still builtins, which is what the interpreter's own loop patches. And a device
function called inside a launch that has already patched the language modules it sees patches
nothing again (another 5% of the interpreted suites' time). Where Triton's interpreter no longer
has the functions replaced, with the same parameters, they are left alone.

And it holds `tl.dot` to the operand sizes Triton 3.6 compiles for sm_90 (K >= 16, or 32 for 8-bit
operands), which the interpreter does not check (it allows 1, 1, 1): a launch that would not compile
on the GPU ("Input shapes should have M >= 1, N >= 1 and K >= 16") fails here too.
"""

from __future__ import annotations

import inspect
import os

import torch


def interpret_without_gpu() -> None:
    """On a machine without CUDA: TRITON_INTERPRET=1, and the interpreter's patching made cheaper."""
    if torch.cuda.is_available():
        return
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    _list_builtins_once(tl, interpreter)
    _patch_once_a_launch(tl, interpreter)
    _sm90_dot_sizes(interpreter)


def _sm90_dot_sizes(interpreter) -> None:
    codegen_fns = getattr(getattr(interpreter, "interpreter_builder", None), "codegen_fns", None)
    if isinstance(codegen_fns, dict) and "min_dot_size" in codegen_fns:
        codegen_fns["min_dot_size"] = _sm90_min_dot_size


def _sm90_min_dot_size(lhs_type, rhs_type) -> tuple[int, int, int]:
    """(M, N, K) lower bounds of a tl.dot on sm_90 with Triton 3.6 (the GPU's): K >= 32 for 8-bit
    operands, 16 for the others (fp32 included; Triton 3.9 relaxes fp32 to 8)."""
    return (1, 1, 32) if lhs_type.scalar.primitive_bitwidth == 8 else (1, 1, 16)


def _list_builtins_once(tl, interpreter) -> None:
    original, patch_attr = getattr(interpreter, "_patch_builtin", None), getattr(interpreter, "_patch_attr", None)
    if not callable(original) or not callable(patch_attr) or getattr(original, "_lists_once", False):
        return
    if list(inspect.signature(original).parameters) != ["pkg", "builder", "scope"]:
        return
    names: dict[object, list[str]] = {}

    def patch_builtin(pkg, builder, scope):
        if pkg not in names:
            names[pkg] = [name for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member)]
        for name in names[pkg]:
            member = getattr(pkg, name)
            if tl.core.is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)

    patch_builtin._lists_once = True
    interpreter._patch_builtin = patch_builtin


def _patch_once_a_launch(tl, interpreter) -> None:
    """A device-function call inside a kernel launch patches nothing when the launch has already
    patched the language modules the function sees (the patching depends on nothing else); the
    launch's own patching and its restore are the interpreter's."""
    original, scope_type = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "_LangPatchScope", None)
    if not callable(original) or scope_type is None or not callable(getattr(scope_type, "restore", None)) \
            or getattr(original, "_once_a_launch", False):
        return
    if list(inspect.signature(original).parameters) != ["fn"]:
        return
    patched: set[int] = set()  # ids of the language modules patched since the last restore
    seen: dict[object, frozenset] = {}

    def patch_lang(fn):
        langs = seen.get(fn)
        if langs is None:
            langs = seen[fn] = frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v)
                                         and v in (tl, tl.core))
        if langs and langs <= patched:
            return scope_type()
        scope = original(fn)
        patched.update(langs)
        return scope

    restore = scope_type.restore

    def restore_and_forget(self):
        patched.clear()
        restore(self)

    patch_lang._once_a_launch = True
    interpreter._patch_lang = patch_lang
    scope_type.restore = restore_and_forget
