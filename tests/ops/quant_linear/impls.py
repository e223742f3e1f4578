"""Every implementation of the quantized linear ops, as contract-suite parameters: `run(x, case)`
returns y [M, N] for the case's format (fp8 per-channel with a static input scale, fp8 128x128
blocks, int4 with group 32 or 128).

    reference    gdn_export.ops.quant_linear.naive (fp32)
    op           the public op on CPU tensors (torch.ops.gdn.*: dispatch to the reference)
    op-cuda      the public op on CUDA tensors (dispatch to kernels.quant_linear.gpu's routing)
    triton       kernels.quant_linear.gpu with the one-row GEMV off (the skinny / prefill GEMMs)
    triton-gemv  the same with the one-row GEMV on (M = 1 cases)
    onnx         the exported node (QuantizeLinear / DequantizeLinear + MatMul) in ONNX Runtime's CPU
                 provider; not for fp8 blocks, whose graph keeps x in 16 bits (tests/ops/quant_linear/test_onnx.py)
"""

from __future__ import annotations

import contextlib

import torch

from tests.ops.impl import Impl


def _args(x, case):
    if case.form == "fp8":
        return x["x"], x["weight"], x["weight_scale"], x["input_scale"], x["bias"]
    if case.form == "fp8-block":
        return x["x"], x["weight"], x["weight_scale_inv"], x["bias"]
    return x["x"], x["qweight"], x["scales"], x["bias"], case.group


def _name(case):
    return {"fp8": "fp8_linear", "fp8-block": "fp8_block_linear"}.get(case.form, "int4_linear")


def _naive(x, case):
    from gdn_export.ops.quant_linear import naive

    return getattr(naive, _name(case))(*_args(x, case))


def _op(x, case):
    import gdn_export.ops.quant_linear as ops

    return getattr(ops, _name(case))(*_args(x, case))


@contextlib.contextmanager
def _gemv(on: bool):
    from kernels.quant_linear.triton import common

    old = common.GEMV
    common.GEMV = on
    try:
        yield
    finally:
        common.GEMV = old


def _triton(gemv: bool):
    def run(x, case):
        from kernels.quant_linear import gpu
        from kernels.quant_linear.triton import common
        from tests.ops.quant_linear.cases import nan_empty

        empty, common.empty = common.empty, nan_empty  # every buffer the launchers allocate starts as NaN
        try:
            with _gemv(gemv):
                return getattr(gpu, _name(case))(*_args(x, case))
        finally:
            common.empty = empty

    return run


def _module(case, x):
    """The model's quantized linear module holding x's weights (the op has no AWQ pre-scale: the
    module's is 1 here)."""
    from gdn_export.modules.quant_linear import Fp8Linear, Int4Linear

    if case.form == "fp8":
        m = Fp8Linear(case.K, case.N)
        m.weight.copy_(x["weight"])
        m.weight_scale.copy_(x["weight_scale"])
        m.input_scale.copy_(x["input_scale"])
    else:
        m = Int4Linear(case.K, case.N, case.group, dtype=torch.float32)
        m.weight.copy_(x["qweight"])
        m.weight_scale.copy_(x["scales"])
        m.pre_quant_scale.fill_(1.0)
    return m


def _onnx(x, case):
    import onnxruntime as ort

    from tests.ops.quant_linear.test_onnx import export

    proto = export(_module(case, x).eval(), torch.zeros(2, 3, case.K))
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")  # exact fp32 MatMulNBits
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    y = sess.run(None, {sess.get_inputs()[0].name: x["x"].float().numpy()[None]})[0][0]
    return torch.from_numpy(y)


IMPLS = [
    Impl("reference", "reference", _naive),
    Impl("op", "reference", _op),
    Impl("op-cuda", "cuda", _op),
    Impl("triton", "triton", _triton(False)),
    Impl("triton-gemv", "triton", _triton(True), supports=lambda case, dtype: case.M == 1),
    Impl("onnx", "onnx", _onnx,
         supports=lambda case, dtype: case.form != "fp8-block" and dtype == torch.float32 and case.bias is False),
]
