"""Gated delta rule kernels: Triton (triton/) and CUDA (cuda/: gatedDeltaRuleKernels.h is the C++ entry);
the op's contract is gdn_export/ops/gated_delta_rule/__init__.py."""
