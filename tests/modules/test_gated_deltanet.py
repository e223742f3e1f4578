"""GDN mixer: both projection layouts, against a from-scratch float64 recurrence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gdn_export.hf_config import parse_config
from gdn_export.config import HybridConfig
from gdn_export.modules.gated_deltanet import GatedDeltaNet
from gdn_export.weights.tiny import tiny_config_dict
from tests.modules._steps import step

SHAPES = [  # (Hk, Hv, Dk, Dv)
    (2, 4, 16, 24),
    (1, 3, 8, 8),
    (2, 2, 16, 8),
]
SHAPE_IDS = ["Hk2-Hv4-Dk16-Dv24", "Hk1-Hv3-Dk8-Dv8", "Hk2-Hv2-Dk16-Dv8"]


def _config(family, Hk, Hv, Dk, Dv):
    return parse_config(tiny_config_dict(
        family, linear_num_key_heads=Hk, linear_num_value_heads=Hv,
        linear_key_head_dim=Dk, linear_value_head_dim=Dv))


def _randomise(module, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name == "A_log":
                p.copy_(torch.empty(p.shape).uniform_(1, 16, generator=gen).log())
            elif name == "dt_bias":
                p.copy_(torch.randn(p.shape, generator=gen) - 2)
            elif name == "norm.weight":
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name == "conv1d.weight":
                p.copy_(0.4 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def _reference(m: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
    """Split-layout GDN from the formulas, token by token, in float64, zero initial state."""
    x = x.double()
    W = {n: p.detach().double() for n, p in m.named_parameters()}
    B, T, _ = x.shape
    Hk, Hv, Dk, Dv, K = m.num_k_heads, m.num_v_heads, m.head_k_dim, m.head_v_dim, m.conv_kernel_size
    mixed = x @ W["in_proj_qkv.weight"].T  # [B, T, C]
    padded = torch.cat([mixed.new_zeros(B, K - 1, mixed.shape[-1]), mixed], dim=1)
    w = W["conv1d.weight"][:, 0]  # [C, K]
    conv = torch.stack([(padded[:, t:t + K] * w.T).sum(1) for t in range(T)], dim=1)
    conv = F.silu(conv)
    q = conv[..., :Hk * Dk].reshape(B, T, Hk, Dk)
    k = conv[..., Hk * Dk:2 * Hk * Dk].reshape(B, T, Hk, Dk)
    v = conv[..., 2 * Hk * Dk:].reshape(B, T, Hv, Dv)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * Dk**-0.5
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    z = (x @ W["in_proj_z.weight"].T).reshape(B, T, Hv, Dv)
    beta = torch.sigmoid(x @ W["in_proj_b.weight"].T)
    g = -W["A_log"].exp() * F.softplus(x @ W["in_proj_a.weight"].T + W["dt_bias"])
    o = torch.zeros(B, T, Hv, Dv, dtype=torch.float64)
    for h in range(Hv):
        kh = h // (Hv // Hk)
        S = torch.zeros(B, Dk, Dv, dtype=torch.float64)
        for t in range(T):
            S = S * g[:, t, h].exp()[:, None, None]
            kt = k[:, t, kh]
            u = beta[:, t, h, None] * (v[:, t, h] - torch.einsum("bkv,bk->bv", S, kt))
            S = S + kt[:, :, None] * u[:, None, :]
            o[:, t, h] = torch.einsum("bkv,bk->bv", S, q[:, t, kh])
    o = o / torch.sqrt((o * o).mean(-1, keepdim=True) + m.norm.eps) * W["norm.weight"] * F.silu(z)
    return o.reshape(B, T, Hv * Dv) @ W["out_proj.weight"].T


def _fused_to_split(fused: GatedDeltaNet, split: GatedDeltaNet) -> None:
    """Re-pack the fused per-key-head layout into the split one, by explicit row indices."""
    Hk, Hv, Dk, Dv = fused.num_k_heads, fused.num_v_heads, fused.head_k_dim, fused.head_v_dim
    m = Hv // Hk
    width = 2 * Dk + 2 * m * Dv
    qkvz, ba = fused.in_proj_qkvz.weight, fused.in_proj_ba.weight
    rows = lambda kh, a, b: qkvz[kh * width + a: kh * width + b]  # noqa: E731
    q = [rows(kh, 0, Dk) for kh in range(Hk)]
    k = [rows(kh, Dk, 2 * Dk) for kh in range(Hk)]
    v = [rows(kh, 2 * Dk, 2 * Dk + m * Dv) for kh in range(Hk)]
    z = [rows(kh, 2 * Dk + m * Dv, width) for kh in range(Hk)]
    with torch.no_grad():
        split.in_proj_qkv.weight.copy_(torch.cat(q + k + v))
        split.in_proj_z.weight.copy_(torch.cat(z))
        split.in_proj_b.weight.copy_(torch.cat([ba[kh * 2 * m: kh * 2 * m + m] for kh in range(Hk)]))
        split.in_proj_a.weight.copy_(torch.cat([ba[kh * 2 * m + m: (kh + 1) * 2 * m] for kh in range(Hk)]))
        for name in ("conv1d.weight", "A_log", "dt_bias", "norm.weight", "out_proj.weight"):
            split.get_parameter(name).copy_(fused.get_parameter(name))


def _run(m, x, lens=None):
    B, T = x.shape[:2]
    conv = torch.zeros(B, m.conv_dim, m.conv_kernel_size - 1)
    rec = torch.zeros(B, m.num_v_heads, m.head_k_dim, m.head_v_dim)
    return m(x, step(B, T, lens=lens), conv, rec)


@pytest.mark.parametrize("T", [1, 5, 65], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_split_layout_matches_reference(shape, T):
    m = GatedDeltaNet(_config("qwen3_5", *shape), 0)
    assert m.layout == "split"
    _randomise(m, seed=T)
    x = torch.randn(2, T, m.out_proj.out_features, generator=torch.Generator().manual_seed(7))
    out, conv_state, rec_state = _run(m, x)
    torch.testing.assert_close(out.double(), _reference(m, x), atol=2e-5, rtol=1e-4)
    assert conv_state.shape == (2, m.conv_dim, 3) and rec_state.dtype == torch.float32


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_fused_layout_equals_repacked_split(shape):
    fused = GatedDeltaNet(_config("qwen3_next", *shape), 0)
    split = GatedDeltaNet(_config("qwen3_5", *shape), 0)
    assert fused.layout == "fused"
    _randomise(fused, seed=3)
    _fused_to_split(fused, split)
    x = torch.randn(2, 9, fused.out_proj.out_features)
    for a, b in zip(_run(fused, x), _run(split, x)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("split_at", [1, 63, 64], ids=lambda s: f"split{s}")
def test_states_carry_over(split_at):
    m = GatedDeltaNet(_config("qwen3_next", 2, 4, 16, 24), 0)
    _randomise(m, seed=5)
    x = torch.randn(1, 70, m.out_proj.out_features)
    full, conv_full, rec_full = _run(m, x)
    first, conv, rec = _run(m, x[:, :split_at])
    rest, conv, rec = m(x[:, split_at:], step(1, 70 - split_at, split_at), conv, rec)
    torch.testing.assert_close(torch.cat([first, rest], 1), full, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(conv, conv_full)
    torch.testing.assert_close(rec, rec_full, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next"])
def test_padded_tokens_leave_the_states_of_their_row_alone(family):
    """Right-padded rows of 1, 6 and 13 tokens: each row's output and final states equal the row
    run alone (padding takes an identity step: g = 0, beta = 0, and the conv reads seq_lens)."""
    m = GatedDeltaNet(_config(family, 2, 4, 16, 24), 0)
    _randomise(m, seed=11)
    lens = [1, 6, 13]
    x = torch.randn(3, 13, m.out_proj.out_features)
    out, conv, rec = _run(m, x, lens)
    for b, n in enumerate(lens):
        alone, conv_b, rec_b = _run(m, x[b:b + 1, :n])
        torch.testing.assert_close(out[b, :n], alone[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(conv[b], conv_b[0])
        torch.testing.assert_close(rec[b], rec_b[0], atol=1e-6, rtol=1e-5)
