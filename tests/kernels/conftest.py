"""Run the Triton kernels on CPU tensors under Triton's interpreter when no CUDA GPU is present.

`triton.jit` decides between compiling and interpreting when a kernel is defined, so the variable
must be set before the Triton kernels are imported: conftest.py is loaded before the test modules here.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


if torch.cuda.is_available():
    import pytest

    @pytest.fixture(autouse=True)
    def _release_cached_gpu_memory():
        """Give the caching allocator's blocks back after each test: several pytest-xdist workers
        share one GPU, and each would otherwise keep the peak of every test it ran."""
        yield
        torch.cuda.empty_cache()


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
