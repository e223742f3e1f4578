"""The quantized linear Triton kernels: common.py (launch tables, e4m3 rounding), fp8.py (FP8 GEMM and
the activation quantization), int4.py (W4A16 GEMM, dequantization), gemv.py (one-row GEMV, all formats)."""
