"""silu(gate) * up kernels: Triton (triton/silu_mul.py); the op's contract is gdn_export/ops/silu_mul/__init__.py."""
