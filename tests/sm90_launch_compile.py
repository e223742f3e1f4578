"""Compile a Triton launcher's kernels for sm_90 exactly as the launcher would launch them, without a GPU.

    python tests/sm90_launch_compile.py CASE [CASE ...]      # run by tests (a child without TRITON_INTERPRET)

The interpreter runs a kernel's taken branches only and widens 16-bit dot operands; the GPU compiles
every branch (a constexpr-dead one after an early `return` too) with the real pointer dtypes. Here
each kernel object a launcher uses is replaced by a recorder: the launcher runs on meta tensors
(shapes and dtypes, no data), and every launch it makes is compiled with triton.compile for sm_90
from the launch's own arguments: tensors as pointers of their dtype (16-byte aligned), Python ints as
i32 (i64 past 2**31), floats as fp32, None and the kernel's constexpr parameters as constexprs,
num_warps / num_stages from the launch. A compile error is the launcher's bug on a GPU.
Prints one line per compiled launch ("OK name, its flags, warps, stages, shared bytes"), exits 1 on the
first failure. (Registers and spills: benchmarks/sm90_compile_report.py.)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

_PTR = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int32: "i32",
        torch.int64: "i64", torch.bool: "i1", torch.uint8: "u8", torch.int8: "i8",
        torch.float8_e4m3fn: "fp8e4nv"}


class Recorder:
    """Stands in for a @triton.jit kernel: `kernel[grid](*args, **kwargs)` compiles instead of launching."""

    def __init__(self, fn, name, compiled):
        self.fn, self.name, self.compiled = fn, name, compiled

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.compiled.append(compile_launch(self.fn, self.name, args, kwargs))
        return launch

    def __getattr__(self, attr):
        return getattr(self.fn, attr)


def compile_launch(fn, name, args, kwargs) -> str:
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    values = dict(zip(fn.arg_names, args), **kwargs)
    constexpr_names = {p.name for p in fn.params if p.is_constexpr}
    sig, constexprs, attrs = {}, {}, {}
    defaults = {p.name: p.default for p in fn.params}
    for i, arg in enumerate(fn.arg_names):
        v = values[arg] if arg in values else defaults[arg]  # a defaulted constexpr
        if arg in constexpr_names or v is None:
            sig[arg] = "constexpr"
            constexprs[arg] = v
        elif isinstance(v, torch.Tensor):
            sig[arg] = "*" + _PTR[v.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[arg] = "i1"
        elif isinstance(v, int):
            sig[arg] = "i32" if -2**31 <= v < 2**31 else "i64"
        elif isinstance(v, float):
            sig[arg] = "fp32"
        else:
            raise TypeError(f"{name}: argument {arg} of type {type(v).__name__}")
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 64), options=options)
    flags = " ".join(f"{c}={constexprs[c]}" for c in sorted(constexprs) if c.isupper() and constexprs[c] is not None)
    return f"OK {name} {flags} warps={options.get('num_warps')} stages={options.get('num_stages')} " \
           f"shared={k.metadata.shared}"


def gdn_chunk(form: str, dtype: torch.dtype, D: int, varlen: bool) -> list[str]:
    """chunk_gated_delta_rule in `form` on meta tensors of 2 x 130 tokens (or a pack of 3 sequences)."""
    from kernels.gated_delta_rule.triton import chunk, wy

    compiled: list[str] = []
    patches = [(wy, "chunk_wy_fwd_kernel"), (chunk, "chunk_state_output_fwd_kernel"),
               (chunk, "chunk_fused_fwd_kernel")]
    saved = [(m, n, getattr(m, n)) for m, n in patches]
    try:
        for m, n, f in saved:
            setattr(m, n, Recorder(f, n, compiled))
        B, T = (1, 260) if varlen else (2, 130)
        meta = dict(device="meta", dtype=dtype)
        q, k = torch.empty(B, T, 2, D, **meta), torch.empty(B, T, 2, D, **meta)
        v = torch.empty(B, T, 4, D, **meta)
        g = torch.empty(B, T, 4, device="meta", dtype=torch.float32)
        beta = torch.empty(B, T, 4, **meta)
        h0 = torch.empty(3 if varlen else B, 4, D, D, device="meta", dtype=torch.float32)
        # a pack's offsets stay on the CPU: the host check and the chunk table read their values (the
        # recorder needs only their dtype)
        cu = torch.tensor([0, 5, 130, 260], dtype=torch.int32) if varlen else None
        chunk.chunk_gated_delta_rule(q, k, v, g, beta, h0, None, True, cu, form=form)
    finally:
        for m, n, f in saved:
            setattr(m, n, f)
    return compiled


CASES = {f"gdn-{form}-{dt}-D{D}{'-varlen' if vl else ''}": (gdn_chunk, (form, dtype, D, vl))
         for form in ("two-pass", "fused")
         for dt, dtype, D, vl in (("bf16", torch.bfloat16, 128, False), ("fp16", torch.float16, 64, True),
                                  ("fp32", torch.float32, 32, False))}


def main(argv) -> int:
    for name in argv or list(CASES):
        fn, args = CASES[name]
        try:
            for line in fn(*args):
                print(f"{name}: {line}", flush=True)
        except Exception as exc:  # noqa: BLE001  (the case's one-line verdict)
            print(f"FAIL {name}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
