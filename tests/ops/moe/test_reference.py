"""The MoE reference against a literal per-token, per-expert loop in float64, against transformers'
own experts module, its fake (shape) implementation and its one-line input errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gdn_export.ops import moe
from gdn_export.ops.moe import sparse_moe_forward
from gdn_export.ops.moe.naive import moe as reference
from tests.ops.moe.inputs import moe_inputs


def _literal(hidden, logits, gate_up, down, top_k, norm):
    """Every token, every expert, in float64: the weight is 0 outside the token's top-k."""
    N, E = logits.shape
    I = down.shape[-1]
    probs = torch.softmax(logits.double(), -1)
    out = torch.zeros(N, hidden.shape[1], dtype=torch.float64)
    for n in range(N):
        chosen = sorted(range(E), key=lambda e: -probs[n, e].item())[:top_k]
        total = sum(probs[n, e] for e in chosen) if norm else 1.0
        for e in chosen:
            h = gate_up[e].double() @ hidden[n].double()
            act = F.silu(h[:I]) * h[I:]
            out[n] += probs[n, e] / total * (down[e].double() @ act)
    return out


CASES = {  # (N, H, E, I, top_k, norm)
    "N1-E4-k1": (1, 8, 4, 6, 1, True),
    "N7-E8-k2-nonorm": (7, 16, 8, 5, 2, False),
    "N13-E16-k4": (13, 12, 16, 7, 4, True),
    "N5-E3-k3-all": (5, 8, 3, 4, 3, True),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_reference_matches_literal_loop(case):
    N, H, E, I, k, norm = case
    args = moe_inputs(N, H, E, I, torch.float64, seed=N)
    out = moe(*args, k, norm)
    assert out.dtype == torch.float64 and out.shape == (N, H)
    torch.testing.assert_close(out, _literal(*args, k, norm), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("norm", [True, False], ids=["norm", "nonorm"])
def test_reference_matches_transformers(norm):
    """fp32 against transformers' Qwen3-Next router + Qwen3.5-MoE experts (same stacked layout)."""
    cfg_mod = pytest.importorskip("transformers.models.qwen3_next.configuration_qwen3_next")
    mod = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    cfg = cfg_mod.Qwen3NextConfig(hidden_size=32, moe_intermediate_size=24, num_experts=8,
                                  num_experts_per_tok=3, norm_topk_prob=norm, shared_expert_intermediate_size=16)
    torch.manual_seed(0)
    block = mod.Qwen3NextSparseMoeBlock(cfg).eval()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        expected = block(x)
        got = sparse_moe_forward(x, block)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_low_precision_inputs_run_in_fp32():
    args = moe_inputs(9, 16, 6, 8, torch.bfloat16)
    out = moe(*args, 2, True)
    assert out.dtype == torch.bfloat16
    exact = moe(*(t.double() for t in args), 2, True)
    torch.testing.assert_close(out.double(), exact, atol=1e-2, rtol=1e-2)


def test_fake_gives_shape_and_dtype():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        args = moe_inputs(5, 16, 4, 8, torch.float16)
        out = torch.ops.gdn.moe(*args, 2, True)
    assert out.shape == (5, 16) and out.dtype == torch.float16


BAD = {
    "hidden-rank": ((3, 4, 8), (3, 4), (4, 12, 8), (4, 8, 6), 2, "hidden must be"),
    "logits-N": ((3, 8), (2, 4), (4, 12, 8), (4, 8, 6), 2, "router_logits must be"),
    "gate_up-E": ((3, 8), (3, 4), (5, 12, 8), (4, 8, 6), 2, "gate_up must be"),
    "gate_up-odd": ((3, 8), (3, 4), (4, 11, 8), (4, 8, 6), 2, "gate_up must be"),
    "down-I": ((3, 8), (3, 4), (4, 12, 8), (4, 8, 5), 2, "down must be"),
    "top_k-0": ((3, 8), (3, 4), (4, 12, 8), (4, 8, 6), 0, "top_k must be"),
    "top_k-gt-E": ((3, 8), (3, 4), (4, 12, 8), (4, 8, 6), 5, "top_k must be"),
}


@pytest.mark.parametrize("case", list(BAD.values()), ids=list(BAD))
def test_bad_inputs_are_one_line(case):
    *shapes, k, message = case
    with pytest.raises(ValueError, match=message) as info:
        moe(*(torch.randn(s) for s in shapes), k, True)
    assert "\n" not in str(info.value)


def test_integer_hidden_is_rejected():
    with pytest.raises(ValueError, match="hidden must be a floating tensor"):
        moe(torch.ones(3, 8, dtype=torch.int32), torch.randn(3, 4), torch.randn(4, 12, 8), torch.randn(4, 8, 6), 2)
