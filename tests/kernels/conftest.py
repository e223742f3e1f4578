"""Run the Triton kernels on CPU tensors under Triton's interpreter when no CUDA GPU is present.

`triton.jit` decides between compiling and interpreting when a kernel is defined, so the variable
must be set before gdn_kernels is imported: conftest.py is loaded before the test modules here.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
