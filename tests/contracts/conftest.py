"""Contract suites: one per op, every implementation of it a parameter (see tests/contracts/impl.py).

Triton's interpreter is chosen when a kernel is defined, so TRITON_INTERPRET is set here, before any
test module of this folder imports a Triton kernel (CPU-only machines; with a GPU the kernels run on
it)."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

if torch.cuda.is_available():

    @pytest.fixture(autouse=True)
    def _release_cached_gpu_memory():
        """Several pytest-xdist workers share one GPU: give the allocator's blocks back after each test."""
        yield
        torch.cuda.empty_cache()
