"""Run the Triton kernels on CPU tensors under Triton's interpreter when no CUDA GPU is present.

`triton.jit` decides between compiling and interpreting when a kernel is defined, so the variable
must be set before the Triton kernels are imported: conftest.py is loaded before the test modules here.
"""

import os

import torch

from tests.triton_interpreter import interpret_without_gpu

interpret_without_gpu()


def pytest_collection_modifyitems(config, items):
    """With a GPU these Triton tests run on it: mark them `gpu` there, so that `pytest -m gpu`
    (tests/gpu_run.sh) includes them; on a CPU-only machine they stay in the CPU suite."""
    if not torch.cuda.is_available():
        return
    import pytest

    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
