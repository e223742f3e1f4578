"""The fused silu(gate) * up Triton kernel (silu_mul.py)."""
