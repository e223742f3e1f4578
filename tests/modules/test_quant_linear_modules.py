"""Quantized Linear modules: dtypes survive model.to(...), and fuse_linears groups quantized siblings
(same format; mixed groups as parts) with the outputs of the separate GEMMs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gdn_export.modules.fused_linear import fuse_linears, project_together
from gdn_export.modules.quant_linear import Fp8BlockLinear, Fp8Linear, Int4Linear
from gdn_export.ops.quant_linear.naive import pack_int4


def make(kind, K, N, gen, input_scale=0.05, pre=None):
    if kind == "fp8":
        m = Fp8Linear(K, N)
        m.weight.copy_(torch.randn(N, K, generator=gen).to(torch.float8_e4m3fn))
        m.weight_scale.copy_(torch.rand(N, generator=gen) * 0.01)
        m.input_scale.fill_(input_scale)
    elif kind == "fp8-block":
        m = Fp8BlockLinear(K, N)
        m.weight.copy_(torch.randn(N, K, generator=gen).to(torch.float8_e4m3fn))
        m.weight_scale_inv.copy_(torch.rand(m.weight_scale_inv.shape, generator=gen) * 0.01)
    elif kind == "int4":
        m = Int4Linear(K, N, 32, dtype=torch.float32)
        m.weight.copy_(pack_int4(torch.randint(-8, 8, (N, K), generator=gen)))
        m.weight_scale.copy_(torch.rand(m.weight_scale.shape, generator=gen) * 0.01)
        m.pre_quant_scale.copy_(pre if pre is not None else torch.ones(K))
    else:
        m = nn.Linear(K, N, bias=False)
    return m


class Siblings(nn.Module):
    def __init__(self, members):
        super().__init__()
        self.members = nn.ModuleList(members)

    def fusible_linears(self):
        return [tuple(self.members)]

    def forward(self, x):
        return project_together(x, *self.members)


CASES = [
    pytest.param(["fp8", "fp8", "fp8"], 1, id="fp8-qkv"),
    pytest.param(["fp8-block", "fp8-block"], 1, id="fp8-block-128rows"),
    pytest.param(["int4", "int4"], 1, id="int4-gate-up"),
    pytest.param(["fp8", "fp8", "linear", "linear"], 2, id="fp8-then-16bit"),
]


@pytest.mark.parametrize("kinds,groups", CASES)
def test_fused_quantized_siblings_match_separate(kinds, groups):
    gen = torch.Generator().manual_seed(0)
    K = 96
    pre = torch.rand(K, generator=gen) + 0.5
    rows = 128 if "fp8-block" in kinds else 40
    block = Siblings([make(k, K, rows, gen, pre=pre) for k in kinds])
    x = torch.randn(3, 5, K, generator=gen)
    want = block(x)
    assert fuse_linears(block) == groups
    got = block(x)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert all(not k.startswith("_fused") for k in block.state_dict())


def test_unequal_input_scales_not_fused():
    gen = torch.Generator().manual_seed(0)
    block = Siblings([make("fp8", 64, 16, gen, 0.05), make("fp8", 64, 16, gen, 0.07)])
    assert fuse_linears(block) == 0


def test_partial_block_rows_not_fused():
    gen = torch.Generator().manual_seed(0)
    block = Siblings([make("fp8-block", 64, 100, gen), make("fp8-block", 64, 100, gen)])
    assert fuse_linears(block) == 0


def test_dtypes_kept_by_to():
    gen = torch.Generator().manual_seed(0)
    fp8, block, int4 = make("fp8", 64, 16, gen), make("fp8-block", 64, 16, gen), make("int4", 64, 16, gen)
    for m in (fp8, block, int4):
        m.to(torch.bfloat16)
    assert fp8.weight.dtype == torch.float8_e4m3fn and fp8.weight_scale.dtype == torch.float32
    assert fp8.input_scale.dtype == torch.float32 and block.weight_scale_inv.dtype == torch.float32
    assert int4.weight.dtype == torch.uint8 and int4.weight_scale.dtype == torch.bfloat16
    y = int4(torch.randn(2, 64, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16
