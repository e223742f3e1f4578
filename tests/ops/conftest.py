"""The ops' tests: one folder per op (its contract suite over every implementation, and every other
test of that op), the shared `Impl` plumbing in impl.py.

TRITON_INTERPRET is set by tests/conftest.py (CPU-only machines; with a GPU the kernels run on it)."""

import os

import torch

# Files that call the Triton kernels directly (outside the contract suites, whose Impl marks itself).
TRITON_FILES = ("test_triton", "test_token_strided_inputs", "test_silu_mul_fp8", "test_head_rows")


def pytest_collection_modifyitems(config, items):
    """With a GPU the Triton kernel tests run on it: mark them `gpu` there, so that `pytest -m gpu`
    (tests/gpu_run.sh) includes them; on a CPU-only machine they stay in the CPU suite."""
    if not torch.cuda.is_available():
        return
    import pytest

    here = os.path.dirname(__file__)
    for item in items:
        path = str(item.fspath)
        if path.startswith(here) and os.path.basename(path).startswith(TRITON_FILES):
            item.add_marker(pytest.mark.gpu)
