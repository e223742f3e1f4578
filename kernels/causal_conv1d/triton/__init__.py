"""The causal conv1d Triton kernel (conv.py)."""
