"""Causal conv1d kernels: Triton (triton/conv.py) and CUDA (cuda/: causalConv1dKernels.h is the C++ entry);
the op's contract is gdn_export/ops/causal_conv1d/__init__.py."""
