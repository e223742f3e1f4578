"""fuse_linears: sibling projections as one GEMM give the same model, in the same memory, with the
same parameters and state_dict, for every family (GDN layouts fused / split / separate, gated and
OLMo attention, dense MLP and the MoE shared expert)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gdn_export.hf_config import parse_config
from gdn_export.config import HybridConfig
from gdn_export.layout import DeployLayout
from gdn_export.models import HybridForCausalLM
from gdn_export.modules.fused_linear import fuse, fuse_linears, project_together
from gdn_export.weights.tiny import init_tiny_weights, tiny_config_dict

FAMILIES = ["qwen3_5", "qwen3_next", "qwen3_5_moe", "olmo_hybrid"]


def _model(family, **overrides):
    config = parse_config(tiny_config_dict(family, **overrides))
    model = HybridForCausalLM(config, DeployLayout.make(cache_len=48, logits="all")).eval()
    init_tiny_weights(model, 3)
    return model


def _run(model, ids, lens):
    B, T = ids.shape
    with torch.no_grad():
        logits, *states = model(ids, torch.zeros(B, dtype=torch.int64), torch.as_tensor(lens),
                                *model.empty_states(B))
        # one decode step on top, from the states the prefill wrote
        step, *_ = model(ids[:, :1], torch.as_tensor(lens), torch.ones(B, dtype=torch.int64), *states)
    return logits, step


def _storage_bytes(model):
    seen = {}
    for p in model.parameters():
        s = p.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_model_equals_unfused(family):
    model = _model(family)
    ids = torch.randint(0, model.config.vocab_size, (2, 11))
    lens = [11, 6]  # a ragged row too
    want = _run(model, ids, lens)
    names = {k: v.clone() for k, v in model.state_dict().items()}
    before = _storage_bytes(model)

    groups = fuse_linears(model)
    layers = model.config.num_hidden_layers
    assert groups >= 2 * layers, "every mixer and every MLP (or shared expert) fused"
    assert _storage_bytes(model) == before, "members are views of the fused weight: no extra memory"
    after = model.state_dict()
    assert list(after) == list(names)
    for k, v in names.items():
        torch.testing.assert_close(after[k], v, rtol=0, atol=0, msg=k)
    got = _run(model, ids, lens)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert fuse_linears(model) == groups  # a second call finds them fused and changes nothing
    torch.testing.assert_close(_run(model, ids, lens)[0], want[0], rtol=1e-5, atol=1e-5)
    # a dtype / device move after fusing carries the fused weights along
    model.double()
    torch.testing.assert_close(_run(model, ids, lens)[0].double(), want[0].double(), rtol=1e-5, atol=1e-5)


def test_project_together_splits_with_bias_and_falls_back_unfused():
    torch.manual_seed(0)
    a, b, c = nn.Linear(7, 5), nn.Linear(7, 3), nn.Linear(7, 9)
    x = torch.randn(2, 4, 7)
    want = [m(x) for m in (a, b, c)]
    got = project_together(x, a, b, c)  # not fused: the separate calls
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    fuse(a, b, c)
    assert a.weight.untyped_storage().data_ptr() == c.weight.untyped_storage().data_ptr()
    assert "_fused_weight" not in a.state_dict()  # a runtime buffer, not a checkpoint entry
    got = project_together(x, a, b, c)
    assert [t.shape[-1] for t in got] == [5, 3, 9]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    # another grouping of the same modules runs them separately (still correct)
    torch.testing.assert_close(project_together(x, a, b)[1], want[1])


def test_fuse_refuses_mismatched_members():
    with pytest.raises(ValueError, match="share in_features"):
        fuse(nn.Linear(4, 2, bias=False), nn.Linear(5, 2, bias=False))
    with pytest.raises(ValueError, match="bias"):
        fuse(nn.Linear(4, 2, bias=True), nn.Linear(4, 2, bias=False))
