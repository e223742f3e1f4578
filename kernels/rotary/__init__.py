"""Rotary position embedding kernels: Triton (triton/rotary.py); the op's contract is
gdn_export/ops/rotary/__init__.py."""
