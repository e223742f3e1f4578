"""The quantized routed-expert Triton kernels (moe_quant.py)."""
