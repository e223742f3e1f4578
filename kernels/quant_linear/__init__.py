"""Quantized linear kernels: triton/ (FP8 and INT4 GEMMs, the one-row GEMV) and gpu.py (the routing
between them and torch._scaled_mm); the op's contract is gdn_export/ops/quant_linear/__init__.py."""
