"""The fused partial rotary Triton kernel (rotary.py)."""
