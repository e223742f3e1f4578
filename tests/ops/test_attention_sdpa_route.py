"""The SDPA route of gdn::attention (what half-precision calls run on a GPU that neither Triton
kernel takes, or without Triton: the mask repeated over a kv-head group's query heads for one call
when small, else one call per query head against an additive mask shared by the calls) computes the
same function as the op's fp32 path, on the CPU in fp32: grouped heads, ragged causal masks over a
longer cache, streaming-like masks with holes, one query row and many."""

import pytest
import torch

import gdn_export.ops.attention as attention_module
from gdn_export.ops.attention import _attention, _attention_sdpa
from tests.conftest import rel_rms


@pytest.fixture(params=["one-call", "per-head-calls"])
def route(request, monkeypatch):
    """Both forms of the route: the mask repeated for one call (small), one call per head (large)."""
    if request.param == "per-head-calls":
        monkeypatch.setattr(attention_module, "REPEATED_MASK_MAX", 0)
    return request.param


def _mask(B, S, L, kind, gen):
    past = torch.randint(0, L - S + 1, (B,), generator=gen)
    queries = past[:, None] + torch.arange(S)
    mask = torch.arange(L)[None, None, :] <= queries[:, :, None]  # [B, S, L]
    if kind == "holes":  # a ring buffer's unwritten or evicted slots, slot 0 (a sink) kept
        holes = torch.rand(B, 1, L, generator=gen) < 0.3
        holes[..., 0] = False
        mask = mask & ~holes
    return mask[:, None]


@pytest.mark.parametrize("kind", ["causal", "holes"])
@pytest.mark.parametrize("B, H, Hkv, S, L, D", [(2, 16, 2, 33, 70, 32), (3, 4, 4, 5, 9, 16), (1, 6, 2, 1, 40, 64),
                                                 (2, 3, 1, 17, 17, 8)],
                         ids=["gqa8", "mha", "gqa3-one-query", "mqa-full-cache"])
def test_sdpa_route_matches_fp32_path(route, B, H, Hkv, S, L, D, kind):
    gen = torch.Generator().manual_seed(B * 100 + H + S + L)
    q = torch.randn(B, H, S, D, generator=gen)
    k = torch.randn(B, Hkv, L, D, generator=gen)
    v = torch.randn(B, Hkv, L, D, generator=gen)
    mask = _mask(B, S, L, kind, gen)
    got = _attention_sdpa(q, k, v, mask, D ** -0.5)
    want = _attention(q.double(), k.double(), v.double(), mask, D ** -0.5)
    assert got.shape == q.shape and torch.isfinite(got).all()
    assert rel_rms(got, want) < 1e-5


def test_sdpa_route_reads_each_head_group_in_order(route):
    """Query head h must read kv head h // G: give each kv head values of its own constant."""
    B, H, Hkv, S, L, D = 1, 6, 3, 2, 5, 4
    q = torch.randn(B, H, S, D)
    k = torch.randn(B, Hkv, L, D)
    v = torch.arange(Hkv, dtype=torch.float32)[None, :, None, None].expand(B, Hkv, L, D).contiguous()
    o = _attention_sdpa(q, k, v, torch.ones(B, 1, S, L, dtype=torch.bool), 0.5)
    assert torch.allclose(o[0, :, 0, 0], torch.tensor([0.0, 0, 1, 1, 2, 2]), atol=1e-6)
