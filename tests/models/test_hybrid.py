"""HybridForCausalLM: the flat state interface, and cached prefill + decode against one pass."""

from __future__ import annotations

import pytest
import torch

from gdn_export.config import HybridConfig
from gdn_export.errors import InputError
from gdn_export.models import Cache, HybridForCausalLM
from gdn_export.weights.tiny import init_tiny_weights, tiny_config_dict

FAMILIES = ["qwen3_5", "qwen3_next", "qwen3_5_moe", "olmo_hybrid"]


def _model(family, seed=0, **overrides):
    config = HybridConfig.from_dict(tiny_config_dict(family, **overrides))
    model = HybridForCausalLM(config).eval()
    init_tiny_weights(model, seed)
    return model


def _positions(batch, start, length):
    return (torch.arange(length) + start)[None].expand(batch, length)


def test_state_specs_names_shapes_and_dtypes():
    model = _model("qwen3_5", layer_types=["linear_attention", "full_attention"] * 2)
    specs = model.state_specs()
    assert [s.name for s in specs] == [
        "past.0.conv", "past.0.recurrent", "past.1.key", "past.1.value",
        "past.2.conv", "past.2.recurrent", "past.3.key", "past.3.value",
    ]
    assert [s.output_name for s in specs][:2] == ["present.0.conv", "present.0.recurrent"]
    assert specs[0].shape == ("batch", 2 * 2 * 16 + 4 * 24, 3) and specs[0].dtype == torch.float32
    assert specs[1].shape == ("batch", 4, 16, 24)
    assert specs[2].shape == ("batch", 2, "past", 16)
    assert (specs[3].layer, specs[3].kind) == (1, "value")
    states = model.empty_states(3)
    assert [tuple(t.shape) for t in states[:4]] == [(3, 160, 3), (3, 4, 16, 24), (3, 2, 0, 16), (3, 2, 0, 16)]
    assert all(not t.any() for t in states)


@pytest.mark.parametrize("prompt", [1, 63, 130], ids=lambda t: f"prompt{t}")
@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_then_decode_equals_one_pass(family, prompt):
    model = _model(family, seed=prompt)
    B, steps = 2, 8
    ids = torch.randint(0, 256, (B, prompt + steps), generator=torch.Generator().manual_seed(prompt))
    with torch.no_grad():
        full = model(ids, _positions(B, 0, prompt + steps), *model.empty_states(B))[0]
        logits, *states = model(ids[:, :prompt], _positions(B, 0, prompt), *model.empty_states(B))
        outs = [logits]
        for s in range(steps):
            P = prompt + s
            logits, *states = model(ids[:, P:P + 1], _positions(B, P, 1), *states)
            outs.append(logits)
    assert logits.dtype == torch.float32 and states[-1].shape[2] == prompt + steps
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_in_two_pieces(family):
    model = _model(family)
    ids = torch.randint(0, 256, (1, 100))
    with torch.no_grad():
        full = model(ids, _positions(1, 0, 100), *model.empty_states(1))[0]
        first, *states = model(ids[:, :37], _positions(1, 0, 37), *model.empty_states(1))
        second, *_ = model(ids[:, 37:], _positions(1, 37, 63), *states)
    torch.testing.assert_close(torch.cat([first, second], 1), full, atol=1e-4, rtol=0)


def test_bf16_keeps_recurrent_state_fp32():
    model = _model("qwen3_next")
    ids = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        ref = model(ids, _positions(2, 0, 20), *model.empty_states(2))[0]
        model.to(torch.bfloat16)
        specs = model.state_specs()
        assert {s.kind: s.dtype for s in specs} == {
            "conv": torch.bfloat16, "recurrent": torch.float32, "key": torch.bfloat16, "value": torch.bfloat16}
        logits, *states = model(ids, _positions(2, 0, 20), *model.empty_states(2))
    assert logits.dtype == torch.float32
    assert [t.dtype for t in states] == [s.dtype for s in specs]
    rel = (logits - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()
    assert rel < 5e-2, f"bf16 logits drift {rel:.3g} from fp32"


def test_tied_embeddings_share_the_weight():
    model = _model("qwen3_5", tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_bad_states_are_input_errors():
    model = _model("qwen3_5")
    ids, pos = torch.zeros(1, 2, dtype=torch.long), _positions(1, 0, 2)
    states = model.empty_states(1)
    with pytest.raises(InputError, match="expected 8 state tensors"):
        model(ids, pos, *states[:-1])
    states[1] = states[1].double()
    with pytest.raises(InputError, match="past.0.recurrent must be float32"):
        model(ids, pos, *states)
    states = model.empty_states(1)
    states[0] = torch.zeros(1, 7, 3)
    with pytest.raises(InputError, match=r"past.0.conv must be \('batch', 160, 3\)"):
        model(ids, pos, *states)


def test_cache_wrapper_names_states():
    model = _model("qwen3_5")
    cache = Cache(model.state_specs(), model.empty_states(2))
    with torch.no_grad():
        _, *new = model(torch.zeros(2, 5, dtype=torch.long), _positions(2, 0, 5), *cache)
    cache.update(new)
    assert cache.past_length == 5
    assert cache[0, "recurrent"].shape == (2, 4, 16, 24)
