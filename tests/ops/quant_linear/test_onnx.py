"""ONNX translations of the quantized-linear ops, run in ONNX Runtime's CPU provider against the
PyTorch op (same quantization), and their graph form (Q/DQ feeding MatMul, INT4 initializers)."""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from gdn_export.modules.quant_linear import Fp8BlockLinear, Fp8Linear, Int4Linear
from gdn_export.onnx.schemas import custom_translation_table
from gdn_export.ops.quant_linear.naive import pack_int4
from gdn_export.ops.quant_linear.onnx import fold_int4_weights

SHAPES = [pytest.param(64, 48, id="K64-N48"), pytest.param(130, 65, id="K130-N65"), pytest.param(320, 72, id="K320-N72"),
          pytest.param(256, 160, id="K256-N160")]


def make(kind, K, N, gen):
    if kind == "fp8":
        m = Fp8Linear(K, N)
        w = torch.randn(N, K, generator=gen) * 0.05
        m.weight_scale.copy_(w.abs().amax(1) / 448)
        m.weight.copy_((w / m.weight_scale[:, None]).to(torch.float8_e4m3fn))
        m.input_scale.fill_(3.0 / 448)
    elif kind == "fp8-block":
        m = Fp8BlockLinear(K, N)
        m.weight.copy_((torch.randn(N, K, generator=gen) * 100).to(torch.float8_e4m3fn))
        m.weight_scale_inv.copy_(torch.rand(m.weight_scale_inv.shape, generator=gen) * 1e-3)
    else:
        G = 32 if kind == "int4-g32" else 128
        m = Int4Linear(K, N, G, dtype=torch.float32)
        m.weight.copy_(pack_int4(torch.randint(-8, 8, (N, K), generator=gen)))
        m.weight_scale.copy_(torch.rand(m.weight_scale.shape, generator=gen) * 0.01)
        m.pre_quant_scale.copy_(torch.rand(K, generator=gen) + 0.5)
    return m


class Wrap(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)


def export(module, x):
    from torch.export import Dim

    program = torch.onnx.export(Wrap(module), (x,), dynamo=True, opset_version=24,
                                dynamic_shapes=({0: Dim("batch"), 1: Dim("seq")},),
                                custom_translation_table=custom_translation_table(), optimize=True)
    fold_int4_weights(program.model)
    buf = io.BytesIO()
    program.model  # noqa: B018
    import onnx_ir

    proto = onnx_ir.serde.serialize_model(program.model)
    onnx.checker.check_model(proto, full_check=True)
    return proto


def rel(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b ** 2)))


@pytest.mark.parametrize("K,N", SHAPES)
@pytest.mark.parametrize("kind", ["fp8", "int4-g32", "int4-g128", "fp8-block"])
def test_onnx_runtime_matches_pytorch(kind, K, N):
    gen = torch.Generator().manual_seed(K + N)
    module = make(kind, K, N, gen)
    x = torch.randn(2, 5, K, generator=gen)
    proto = export(module, x)
    ops = [n.op_type for n in proto.graph.node]
    inits = {i.name: i.data_type for i in proto.graph.initializer}
    dq = [n for n in proto.graph.node if n.op_type == "DequantizeLinear"]
    weight_dq = [n for n in dq if inits.get(n.input[0]) in (onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.INT4)]
    assert len(weight_dq) == 1, ops  # the weight enters its DequantizeLinear as an initializer
    assert "MatMul" in ops
    if kind == "fp8":
        assert ops.count("QuantizeLinear") == 1 and len(dq) == 2
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    x2 = torch.randn(3, 7, K, generator=gen)  # other batch / seq than traced
    got = sess.run(None, {sess.get_inputs()[0].name: x2.numpy()})[0]
    want = module(x2).numpy()
    if kind == "fp8-block":
        # The graph keeps activations in 16 bits (TensorRT's blockwise weight DQ); the op quantizes
        # them per token group of 128: e4m3 rounding of x, measured 1.5-2.5 % relative RMS.
        assert rel(got, want) < 0.04, rel(got, want)
        exact = nn.functional.linear(x2, module.weight.float() * module.weight_scale_inv.repeat_interleave(
            128, 0)[:N].repeat_interleave(128, 1)[:, :K]).numpy()
        assert rel(got, exact) < 1e-5
    else:
        assert rel(got, want) < 1e-5, rel(got, want)
