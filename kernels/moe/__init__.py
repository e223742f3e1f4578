"""Routed-expert (sparse MoE) kernels with 16-bit weights: Triton (triton/moe.py) and CUDA (cuda/: moeKernels.h
is the C++ entry); the op's contract is gdn_export/ops/moe/__init__.py."""
