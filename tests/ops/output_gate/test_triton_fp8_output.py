"""The output gate kernel's FP8 output (`output_gate_quantized`): the gated attention's output and the
FP8 o_proj's input in one kernel. out must be the plain kernel's bit for bit, outq the projection's own
x pass over out (`quantize_tensor`, the contract's e4m3(clamp(out / s))) bit for bit and e4m3 of the
independent fp32 quotient, row_scale the input scale on every token. o heads-first and the gate a
strided slice interleaved with q (as the q projection gives them); odd head counts, lengths and
widths; the scale a 16-bit value as calibration gives. Outputs poisoned. Under TRITON_INTERPRET=1 on a
CPU; with a GPU, on it."""

from __future__ import annotations

import pytest
import torch

import gdn_export.ops.output_gate as op
from kernels.quant_linear.triton import common as triton_common
from kernels.quant_linear.triton.fp8 import quantize_tensor
from tests.ops.quant_linear.cases import e4m3, input_scale_for, nan_empty

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = [("B2-H3-T37-D64", (2, 3, 37, 64)), ("B1-H4-T70-D96", (1, 4, 70, 96)), ("B3-H1-T5-D256", (3, 1, 5, 256)),
         ("no-tokens", (2, 2, 0, 64))]


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(triton_common, "empty", nan_empty)


@pytest.mark.parametrize("name,shape", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fp8_output_is_the_projection_x_pass_of_the_gated_output(name, shape, dtype):
    B, H, T, D = shape
    gen = torch.Generator().manual_seed(T + D)
    o = (torch.randn(B, H, T, D, generator=gen) * 2).to(dtype).to(DEVICE)
    qg = (torch.randn(B, T, H, 2 * D, generator=gen) * 2).to(dtype).to(DEVICE)
    gate = qg[..., D:]  # [q_h | gate_h] per head
    want = op.output_gate_fused(o, gate)
    scale = input_scale_for(want.float().cpu()) if want.numel() else torch.tensor(0.01)
    scale = scale.to(dtype).float().to(DEVICE)
    out, outq, row_scale = op.output_gate_quantized(o, gate, scale)
    assert torch.equal(out, want) and outq.shape == out.shape and outq.dtype == torch.float8_e4m3fn
    want_q, want_rs = quantize_tensor(out.reshape(B * T, H * D), scale)
    assert torch.equal(outq.reshape(B * T, H * D).view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(outq.float().cpu(), e4m3(out.float().cpu() / scale.cpu()))
    assert row_scale.shape == (B * T, 1) and torch.equal(row_scale, want_rs)


def test_contract_mistakes_are_named():
    o = torch.randn(1, 2, 3, 16, device=DEVICE)
    s = torch.tensor(0.01, device=DEVICE)
    with pytest.raises(ValueError, match="fp16 / bf16"):
        op.output_gate_quantized(o, o.transpose(1, 2), s)
    ob = o.bfloat16()
    with pytest.raises(ValueError, match="one fp32 value"):
        op.output_gate_quantized(ob, ob.transpose(1, 2), s.bfloat16())
    with pytest.raises(ValueError, match="gate must be"):
        op.output_gate_quantized(ob, ob, s)
