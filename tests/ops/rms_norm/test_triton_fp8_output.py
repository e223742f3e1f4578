"""The norm kernel's FP8 output (`rms_norm_quantized`): the norm of an FP8 projection's input and that
input's FP8 form in one kernel. y (and s with a residual) must be the plain kernel's bit for bit,
yq the FP8 projection's own x pass over y (`quantize_tensor`, the contract's e4m3(clamp(y / s))) bit
for bit, and e4m3 of the independent fp32 quotient (torch's division and cast); row_scale the input
scale on every row of the projection input (B T rows for x [B, T, D] and head-split [B, T, H, D]).
Decoder norms (plain, zero-centred, with the residual add) and the GDN output norm (gated, per
value head, x a strided slice); odd widths and row counts; the scale a 16-bit value as calibration
gives (quotients next to e4m3 ties). Outputs poisoned. Under TRITON_INTERPRET=1 on a CPU; with a GPU,
on it."""

from __future__ import annotations

import pytest
import torch

import gdn_export.ops.rms_norm as op
from kernels.quant_linear.triton import common as triton_common
from kernels.quant_linear.triton.fp8 import quantize_tensor
from tests.ops.quant_linear.cases import e4m3, input_scale_for, nan_empty

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# name, x shape, kind ("plain" | "zero" | "add" (zero-centred, residual) | "gated" (head-split, strided))
CASES = [
    ("input-add-B2-T37-D256", (2, 37, 256), "add"),
    ("input-zero-B1-T67-D96", (1, 67, 96), "zero"),
    ("input-plain-B3-T5-D130", (3, 5, 130), "plain"),
    ("gdn-gated-B2-T33-H3-D64", (2, 33, 3, 64), "gated"),
    ("gdn-gated-B1-T5-H2-D48", (1, 5, 2, 48), "gated"),
    ("no-rows", (0, 4, 64), "add"),
]


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(triton_common, "empty", nan_empty)


def _inputs(shape, kind, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    D = shape[-1]
    if kind == "gated":  # o and z as slices of one wider tensor (z split from a projection's output)
        both = torch.randn(*shape[:-1], 2 * D, generator=gen) * 2
        x, gate = both[..., :D], both[..., D:]
    else:
        x, gate = torch.randn(*shape, generator=gen), None
        x[..., :: max(1, D // 3)] *= 30.0  # residual-stream outlier channels
    residual = torch.randn(*shape, generator=gen) * 0.2 if kind == "add" else None
    weight = torch.randn(D, generator=gen) * 0.3 + (0.0 if kind in ("zero", "add") else 1.0)
    t = [None if v is None else v.to(dtype).to(DEVICE) for v in (x, gate, residual, weight)]
    return (*t, kind in ("zero", "add"))


@pytest.mark.parametrize("name,shape,kind", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fp8_output_is_the_projection_x_pass_of_the_norm(name, shape, kind, dtype):
    x, gate, residual, weight, zero = _inputs(shape, kind, dtype, len(name))
    if residual is not None:
        want_s, want_y = op.add_rms_norm_fused(x, residual, weight, 1e-6, zero)
    else:
        want_s, want_y = None, op.rms_norm_fused(x, weight, 1e-6, zero, gate)
    # a 16-bit-valued scale, as calibration's amax / 448 often is
    scale = input_scale_for(want_y.float().cpu()) if want_y.numel() else torch.tensor(0.01)
    scale = scale.to(dtype).float().to(DEVICE)
    s, y, yq, row_scale = op.rms_norm_quantized(x, weight, 1e-6, scale, zero, gate=gate, residual=residual)
    assert torch.equal(y, want_y) and y.dtype == dtype
    if residual is None:
        assert s is None
    else:
        assert torch.equal(s, want_s)
    K = shape[-2] * shape[-1] if kind == "gated" else shape[-1]
    rows = y.numel() // K
    assert yq.dtype == torch.float8_e4m3fn and yq.shape == y.shape
    want_q, want_rs = quantize_tensor(y.reshape(rows, K), scale)
    assert torch.equal(yq.reshape(rows, K).view(torch.uint8), want_q.view(torch.uint8))
    independent = e4m3(y.float().cpu() / scale.cpu())
    assert torch.equal(yq.float().cpu(), independent)
    assert row_scale.shape == (rows, 1) and torch.equal(row_scale, want_rs)
    if rows:
        assert torch.equal(row_scale.cpu(), scale.cpu().expand(rows, 1))


def test_contract_mistakes_are_named():
    x = torch.randn(4, 64, device=DEVICE)
    w = torch.zeros(64, device=DEVICE)
    s = torch.tensor(0.01, device=DEVICE)
    with pytest.raises(ValueError, match="fp16 / bf16"):
        op.rms_norm_quantized(x, w, 1e-6, s)
    xb, wb = x.bfloat16(), w.bfloat16()
    with pytest.raises(ValueError, match="a gate or a residual, not both"):
        op.rms_norm_quantized(xb, wb, 1e-6, s, gate=xb, residual=xb)
    with pytest.raises(ValueError, match="residual must be"):
        op.rms_norm_quantized(xb, wb, 1e-6, s, residual=xb[:, :32])
    with pytest.raises(ValueError, match="one fp32 value"):
        op.rms_norm_quantized(xb, wb, 1e-6, s.bfloat16())
