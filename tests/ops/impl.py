"""What every op's contract suite shares: an implementation as a test parameter.

An `Impl` names one way to run an op (a reference, a Triton kernel, a CUDA kernel, ONNX Runtime on the
exported node, the plugin's host reference) with what it supports. `params(impls, cases)` crosses them
into pytest params with readable ids (`impl-case-dtype`) and the marks each needs:

    gpu   the implementation needs CUDA (cuda kernels; Triton when a GPU is present, so that
          `pytest -m gpu` runs it there), skipped with the reason on a CPU-only machine
    slow  a Triton kernel under TRITON_INTERPRET=1 on a case above the interpreter's cheap size
    cuda_ext  a CUDA implementation (it may wait for the CUDA extension's first build)
    big_gpu_memory  a case tagged "big" (GiBs on the GPU)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
NO_GPU = "needs a CUDA GPU (none found)"
# A Triton kernel interpreted on the CPU costs about this many token-heads a second (2-core CI).
INTERPRETED_CHEAP = 2_000


@dataclass(frozen=True)
class Impl:
    """One implementation of an op.

    name: the id part. kind: "reference" | "triton" | "cuda" | "onnx" | "host" (what decides device
    and marks). run: op-specific callable. supports(case, dtype) -> bool: whether the case applies.
    requires() -> str | None: a skip reason when a tool it needs is missing (checked at run time).
    """

    name: str
    kind: str
    run: Callable
    supports: Callable = lambda case, dtype: True
    requires: Callable = lambda: None
    extra: dict = field(default_factory=dict)

    @property
    def device(self) -> str:
        """Where its inputs live: CUDA for GPU kernels (Triton too when a GPU is present)."""
        return "cuda" if self.kind == "cuda" or (self.kind == "triton" and HAS_CUDA) else "cpu"

    @property
    def interpreted(self) -> bool:
        return self.kind == "triton" and not HAS_CUDA

    def marks(self, cost: int = 0) -> list:
        if self.kind == "cuda":
            return [pytest.mark.gpu, pytest.mark.cuda_ext, pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU)]
        if self.kind == "triton" and HAS_CUDA:
            return [pytest.mark.gpu]
        if self.interpreted and cost > INTERPRETED_CHEAP:
            return [pytest.mark.slow]
        return []

    def skip_if_unavailable(self) -> None:
        reason = self.requires()
        if reason:
            pytest.skip(reason)


def big_marks(case) -> list:
    """[big_gpu_memory] for a case tagged "big" (GiBs of inputs: tests/conftest.py runs a few of
    them at a time on one GPU), else []."""
    return [pytest.mark.big_gpu_memory] if "big" in getattr(case, "tags", ()) else []


def dtype_id(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]


def _interpreted_dtypes(case, dtypes, n):
    """Under Triton's interpreter (CPU) fp16 and bf16 take the same code path as each other (the
    kernels branch on "16-bit", not on which), and below 64-wide heads the same fp32-operand path as
    fp32: fp32 alone there; at Dk >= 64 (16-bit tensor-core operands) also one 16-bit dtype,
    alternating between cases, or the case's only dtypes. Every dtype runs on the GPU."""
    halves = [d for d in dtypes if d in (torch.float16, torch.bfloat16)]
    keep = [d for d in dtypes if d not in halves]
    if halves and (not keep or getattr(case, "Dk", 0) >= 64):
        keep.append(halves[n % len(halves)])
    return [d for d in dtypes if d in keep]


def params(impls, cases, dtypes, cost=lambda case: 0):
    """pytest params (impl, case, dtype) for every supported combination, id `impl-case-dtype`."""
    out = []
    for impl in impls:
        for n, case in enumerate(cases):
            case_dtypes = case.dtypes if getattr(case, "dtypes", None) else dtypes
            if impl.interpreted:
                case_dtypes = _interpreted_dtypes(case, case_dtypes, n)
            for dtype in case_dtypes:
                if impl.supports(case, dtype):
                    out.append(pytest.param(impl, case, dtype, id=f"{impl.name}-{case.name}-{dtype_id(dtype)}",
                                            marks=impl.marks(cost(case)) + big_marks(case)))
    return out


def runnable(cases):
    """The cases this machine runs: those tagged "gpu" (GPU-sized shapes) only where CUDA is."""
    return [c for c in cases if "gpu" not in c.tags or HAS_CUDA]


def poisoned(shape, dtype, device) -> torch.Tensor:
    """An output buffer full of NaN: whatever a kernel leaves unwritten fails the check."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)
