"""The compute kernels of gdn-export, one folder per op, shared by the PyTorch ops
(gdn_export/ops/<op>/), the TensorRT plugins (plugins/<op>Plugin/) and the benchmarks.

    gated_delta_rule/  triton/ (chunked WY prefill, fused recurrent decode, gates)  cuda/ (plugin + extension)
    causal_conv1d/     triton/ (depthwise causal conv with state, ragged)          cuda/
    moe/               triton/ (routed experts, 16-bit weights)                     cuda/
    moe_quant/         triton/ (routed experts, FP8 / INT4 weights)
    attention/         triton/ (decode, prefill, K/V cache write; 16-bit or FP8 cache)
    quant_linear/      triton/ (FP8 / INT4 GEMM, one-row GEMV), gpu.py (routing: Triton or torch._scaled_mm)
    cuda_common/       device helpers of the CUDA kernels (float conversion, mma.sync tiles)
    triton_utils.py    helpers of the Triton kernels (dtype policy, varlen chunk tables, launch fitting)

This package imports nothing of gdn_export: each kernel takes tensors and returns tensors, and its
contract (shapes, dtypes, the fp32 reference it is tested against) is the op's, documented in
gdn_export/ops/<op>/__init__.py. The CUDA sources (`<op>/cuda/`, `cuda_common/`) are C++ with no
TensorRT or PyTorch dependency; they ship inside this package so that the `cuda` backend builds them
from an installed copy. On a machine without a GPU, set TRITON_INTERPRET=1 before importing a Triton
kernel to run it on CPU tensors (slowly).
"""
