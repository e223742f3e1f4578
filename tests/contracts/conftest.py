"""Contract suites: one per op, every implementation of it a parameter (see tests/contracts/impl.py).

Triton's interpreter is chosen when a kernel is defined, so TRITON_INTERPRET is set here, before any
test module of this folder imports a Triton kernel (CPU-only machines; with a GPU the kernels run on
it)."""

from tests.triton_interpreter import interpret_without_gpu

interpret_without_gpu()
