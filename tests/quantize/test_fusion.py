"""Sibling projections quantized for one fused GEMM (gdn_export/quantize/fusion.py): after ModelOpt
calibration every sibling group shares one FP8 input scale (the max) or one AWQ pre_quant_scale
(the mean, weights rescaled), the written checkpoint loads back with every quantized group fused
(gdn_export/modules/quant_fusion.py) and the fused model gives the separate GEMMs' logits:
fp32 to 1e-5 relative RMS (the contract's fp32 bound: the same products, summed in another
GEMM blocking; measured up to 1.8e-6), bf16 to 2e-3
(the same arithmetic; bf16 rounding of the outputs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_export.modules.fused_linear import fuse_linears
from gdn_export.modules.quant_linear import Fp8Linear, Int4Linear, QuantLinear
from gdn_export.quantize.accuracy import dequantized_weight
from gdn_export.quantize.calibrate import apply, calibrate
from gdn_export.quantize.writer import write_quantized
from gdn_export.weights.loader import FAMILIES, load_checkpoint
from gdn_export.weights.tiny import make_tiny_checkpoint

pytest.importorskip("modelopt")

SIZES = dict(hidden_size=192, intermediate_size=320)
CASES = [pytest.param(fam, fmt, id=f"{fam}-{fmt}") for fam in ("qwen3_5", "qwen3_next", "olmo_hybrid")
         for fmt in ("fp8", "int4-awq")]
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-3}


def logits(model, ids):
    B, T = ids.shape
    with torch.no_grad():
        return model(ids, torch.zeros(B, dtype=torch.long), torch.full((B,), T), *model.empty_states(B))[0].float()


def rel(a, b):
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())


def quantized_groups(model):
    """[[member, ...]] of the quantized members (>= 2) of each sibling group."""
    out = []
    for module in model.modules():
        lister = getattr(module, "fusible_linears", None)
        for members in (lister() if lister else []):
            q = [m for m in members if isinstance(m, QuantLinear)]
            if len(q) > 1:
                out.append(q)
    return out


@pytest.mark.parametrize("family,fmt", CASES)
def test_siblings_share_scales_and_fuse(tmp_path, family, fmt):
    src = make_tiny_checkpoint(tmp_path / "bf", family, seed=7, **SIZES)
    rng = np.random.default_rng(2)
    rows = [rng.integers(0, 256, 24) for _ in range(2)]
    original = load_checkpoint(src)
    model = apply(load_checkpoint(src), fmt, calibrate(load_checkpoint(src), fmt, rows))
    groups = quantized_groups(model)
    assert groups, "every family has quantized sibling groups (q/k/v, gate/up, GDN q|k|v/z)"
    names = {id(m): n for n, m in model.named_modules()}
    for members in groups:
        first = members[0]
        for m in members[1:]:
            if fmt == "fp8":
                assert torch.equal(m.input_scale, first.input_scale), names[id(m)]
            else:
                assert torch.equal(m.pre_quant_scale, first.pre_quant_scale), names[id(m)]
        if fmt == "int4-awq":  # AWQ's search left a real pre-scale, not ones
            assert not torch.allclose(first.pre_quant_scale, torch.ones_like(first.pre_quant_scale))
        # the rescaled, requantized weight still approximates the 16-bit one it came from
        for m in members:
            want = original.get_submodule(names[id(m)]).weight.float()
            assert rel(dequantized_weight(m), want) < (0.05 if fmt == "fp8" else 0.2), names[id(m)]

    out = write_quantized(model, FAMILIES[model.config.family], model.config, src, tmp_path / "q", fmt,
                          "modelopt test", torch.float32)
    ids = torch.as_tensor(rng.integers(0, 256, (2, 19)))
    for dtype in (torch.float32, torch.bfloat16):
        loaded = load_checkpoint(out, dtype=dtype)
        want = logits(loaded, ids)
        fused = fuse_linears(loaded)
        # every quantized sibling group is one GEMM, plus the 16-bit groups (GDN b|a, olmo's b|a)
        assert fused >= len(groups), (fused, len(groups))
        for members in quantized_groups(loaded):
            assert members[0]._fused_group is members[-1]._fused_group
            assert any(len(sizes) >= len(members) for _, sizes in members[0]._fused_group.parts)
        got = logits(loaded, ids)
        assert torch.isfinite(got).all()
        assert rel(got, want) <= TOL[dtype], (dtype, rel(got, want))
