"""The fused RMSNorm Triton kernel (rms_norm.py)."""
