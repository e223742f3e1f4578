"""RMSNorm variants against their formulas, in fp32 and in half precision."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gdn_export.modules.norm import GatedRMSNorm, ZeroCenteredRMSNorm


def _rms(x, eps):
    return x / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True) + eps).to(x.dtype)


@pytest.mark.parametrize("dim", [16, 24, 64], ids=lambda d: f"D{d}")
def test_zero_centered_scale_is_one_plus_weight(dim):
    torch.manual_seed(0)
    norm = ZeroCenteredRMSNorm(dim, eps=1e-6)
    x = torch.randn(3, 5, dim)
    assert torch.allclose(norm(x), _rms(x, 1e-6), atol=1e-6)  # zero weight = identity scale
    with torch.no_grad():
        norm.weight.normal_()
    torch.testing.assert_close(norm(x), _rms(x, 1e-6) * (1 + norm.weight), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dim", [16, 24], ids=lambda d: f"D{d}")
def test_gated_norm_formula(dim):
    torch.manual_seed(1)
    norm = GatedRMSNorm(dim, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3)
    x, z = torch.randn(2, 7, 4, dim), torch.randn(2, 7, 4, dim)
    torch.testing.assert_close(norm(x, z), _rms(x, 1e-6) * norm.weight * F.silu(z), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_computes_in_fp32(dtype):
    torch.manual_seed(2)
    zc, gated = ZeroCenteredRMSNorm(24), GatedRMSNorm(24)
    with torch.no_grad():
        zc.weight.normal_(0, 0.1)
        gated.weight.normal_(1, 0.1)
    x, z = torch.randn(4, 24) * 50, torch.randn(4, 24)  # large x: a half-precision mean would overflow
    ref_zc, ref_g = zc(x.to(dtype).float()), gated(x.to(dtype).float(), z.to(dtype).float())
    zc.to(dtype), gated.to(dtype)
    out_zc, out_g = zc(x.to(dtype)), gated(x.to(dtype), z.to(dtype))
    assert out_zc.dtype == dtype and out_g.dtype == dtype
    torch.testing.assert_close(out_zc.float(), ref_zc, atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(out_g.float(), ref_g, atol=2e-2, rtol=1e-2)
