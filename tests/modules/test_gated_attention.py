"""Gated attention: explicit-loop reference, causal mask offset, both cache layouts."""

from __future__ import annotations

import pytest
import torch

from gdn_export.hf_config import parse_config
from gdn_export.config import HybridConfig
from gdn_export.layout import DeployLayout
from gdn_export.modules.gated_attention import GatedAttention, causal_mask
from gdn_export.modules.rotary import RotaryEmbedding, apply_rotary
from gdn_export.weights.tiny import tiny_config_dict
from tests.modules._steps import CONCAT, step

INPLACE = DeployLayout.make(cache_len=80)
LAYOUTS = {"inplace": INPLACE, "concat": CONCAT}


def _attn(gated=True, heads=4, kv_heads=2):
    config = parse_config(tiny_config_dict(
        "qwen3_5", attn_output_gate=gated, num_attention_heads=heads, num_key_value_heads=kv_heads))
    m = GatedAttention(config, 3)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    return m, RotaryEmbedding(config.rotary_dim, config.rope_theta)


def _reference(m: GatedAttention, rope, x, positions):
    """Loops over heads and queries; head h reads kv head h // (H / Hkv); no cache."""
    B, T, _ = x.shape
    H, Hkv, D = m.num_heads, m.num_kv_heads, m.head_dim
    q = m.q_proj(x)
    if m.gated:
        q = q.view(B, T, H, 2, D)
        q, gate = q[:, :, :, 0], q[:, :, :, 1].reshape(B, T, H * D)
    q = m.q_norm(q.reshape(B, T, H, D)).transpose(1, 2)
    k = m.k_norm(m.k_proj(x).view(B, T, Hkv, D)).transpose(1, 2)
    v = m.v_proj(x).view(B, T, Hkv, D).transpose(1, 2)
    cos, sin = rope(positions, x.dtype)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    o = torch.zeros(B, T, H, D)
    for h in range(H):
        kv = h // (H // Hkv)
        for i in range(T):
            s = (k[:, kv, : i + 1] @ q[:, h, i, :, None])[..., 0] * D**-0.5  # [B, i+1]
            o[:, i, h] = (torch.softmax(s, -1)[:, :, None] * v[:, kv, : i + 1]).sum(1)
    o = o.reshape(B, T, H * D)
    if m.gated:
        o = o * torch.sigmoid(gate)
    return m.o_proj(o)


def test_mask_offsets_queries_by_past_length():
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(3, 2, torch.device("cpu")), expected)
    assert torch.equal(causal_mask(4, 0, torch.device("cpu")), torch.ones(4, 4, dtype=torch.bool).tril())


def _cache(layout, kv_heads, batch=2):
    return torch.zeros(batch, kv_heads, layout.cache_len if layout.inplace else 0, 16)


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=list(LAYOUTS))
@pytest.mark.parametrize("gated, heads, kv_heads", [(True, 4, 2), (False, 4, 2), (True, 6, 1), (True, 2, 2)],
                         ids=["gated-H4-KV2", "ungated-H4-KV2", "gated-H6-KV1", "gated-H2-KV2"])
def test_matches_loop_reference(gated, heads, kv_heads, layout):
    m, rope = _attn(gated, heads, kv_heads)
    layout = LAYOUTS[layout]
    x = torch.randn(2, 7, 64)
    positions = torch.arange(7)[None].expand(2, 7)
    out, key, value = m(x, step(2, 7, layout=layout, rope=rope), _cache(layout, kv_heads), _cache(layout, kv_heads))
    torch.testing.assert_close(out, _reference(m, rope, x, positions), atol=1e-5, rtol=1e-4)
    assert key.shape == value.shape == (2, kv_heads, layout.cache_len if layout.inplace else 7, 16)


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=list(LAYOUTS))
@pytest.mark.parametrize("past, new", [(1, 1), (5, 3), (63, 1), (0, 9)], ids=lambda v: str(v))
def test_cached_steps_equal_one_pass(past, new, layout):
    m, rope = _attn()
    layout = LAYOUTS[layout]
    x = torch.randn(2, past + new, 64)
    full, k_full, v_full = m(x, step(2, past + new, layout=layout, rope=rope), _cache(layout, 2), _cache(layout, 2))
    k, v = _cache(layout, 2), _cache(layout, 2)
    if past:
        _, k, v = m(x[:, :past], step(2, past, layout=layout, rope=rope), k, v)
    out, k, v = m(x[:, past:], step(2, new, past, layout=layout, rope=rope), k, v)
    torch.testing.assert_close(out, full[:, past:], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(k, k_full, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(v, v_full, atol=1e-6, rtol=1e-5)


def test_inplace_rows_at_their_own_positions():
    """Row b at past_b: its keys land at slots past_b.., every other slot keeps its content, and the
    row attends only to its own slots <= its position."""
    m, rope = _attn()
    x = torch.randn(3, 4, 64)
    k0, v0 = torch.randn(3, 2, 80, 16), torch.randn(3, 2, 80, 16)
    k, v = k0.clone(), v0.clone()
    out, k, v = m(x, step(3, 4, [0, 10, 50], layout=INPLACE, rope=rope), k, v)
    for b, p in enumerate([0, 10, 50]):
        alone_k, alone_v = k0[b:b + 1].clone(), v0[b:b + 1].clone()
        ref, alone_k, alone_v = m(x[b:b + 1], step(1, 4, p, layout=INPLACE, rope=rope), alone_k, alone_v)
        torch.testing.assert_close(out[b], ref[0])
        torch.testing.assert_close(k[b], alone_k[0])
        untouched = torch.ones(80, dtype=torch.bool)
        untouched[p:p + 4] = False
        assert torch.equal(k[b][:, untouched], k0[b][:, untouched])
