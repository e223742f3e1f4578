"""HybridForCausalLM: the flat state interface, cached prefill + decode against one pass, both K/V
layouts, the in-place cache, ragged rows and streaming."""

from __future__ import annotations

import pytest
import torch

from gdn_export.hf_config import parse_config
from gdn_export.config import HybridConfig
from gdn_export.errors import InputError
from gdn_export.models import Cache, HybridForCausalLM
from gdn_export.layout import DeployLayout
from gdn_export.modules import gated_attention, kv_cache
from gdn_export.weights.tiny import init_tiny_weights, tiny_config_dict

FAMILIES = ["qwen3_5", "qwen3_next", "qwen3_5_moe", "olmo_hybrid"]
ALL = DeployLayout.make(cache_len=160, logits="all")
CONCAT = DeployLayout.make(kv_cache="concat", logits="all")


def _model(family, seed=0, layout=ALL, **overrides):
    config = parse_config(tiny_config_dict(family, **overrides))
    model = HybridForCausalLM(config, layout).eval()
    init_tiny_weights(model, seed)
    return model


def _step(model, ids, past, states, lens=None):
    """One forward call; past / lens as ints (every row) or lists."""
    B, T = ids.shape
    past = torch.as_tensor(past if isinstance(past, list) else [past] * B)
    lens = torch.as_tensor(lens if isinstance(lens, list) else [T] * B)
    with torch.no_grad():
        logits, *states = model(ids, past, lens, *states)
    return logits, states


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
    assert specs[2].shape == ("batch", 2, 160, 16)
    assert (specs[3].layer, specs[3].kind) == (1, "value")
    states = model.empty_states(3)
    assert [tuple(t.shape) for t in states[:4]] == [(3, 160, 3), (3, 4, 16, 24), (3, 2, 160, 16), (3, 2, 160, 16)]
    assert all(not t.any() for t in states)
    model.layout = CONCAT
    assert model.state_specs()[2].shape == ("batch", 2, "past", 16)
    assert tuple(model.empty_states(3)[2].shape) == (3, 2, 0, 16)


@pytest.mark.parametrize("layout", [ALL, CONCAT], ids=["inplace", "concat"])
@pytest.mark.parametrize("prompt", [1, 63, 130], ids=lambda t: f"prompt{t}")
@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_then_decode_equals_one_pass(family, prompt, layout):
    model = _model(family, seed=prompt, layout=layout)
    B, steps = 2, 8
    ids = torch.randint(0, 256, (B, prompt + steps), generator=torch.Generator().manual_seed(prompt))
    full = _step(model, ids, 0, model.empty_states(B))[0]
    logits, states = _step(model, ids[:, :prompt], 0, model.empty_states(B))
    outs = [logits]
    for s in range(steps):
        P = prompt + s
        logits, states = _step(model, ids[:, P:P + 1], P, states)
        outs.append(logits)
    assert logits.dtype == torch.float32
    if not layout.inplace:
        assert states[-1].shape[2] == prompt + steps
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_in_two_pieces(family):
    model = _model(family)
    ids = torch.randint(0, 256, (1, 100))
    full = _step(model, ids, 0, model.empty_states(1))[0]
    first, states = _step(model, ids[:, :37], 0, model.empty_states(1))
    second, _ = _step(model, ids[:, 37:], 37, states)
    torch.testing.assert_close(torch.cat([first, second], 1), full, atol=1e-4, rtol=0)


def test_inplace_cache_is_updated_in_place_without_copies():
    """The torch runner's contract: the K/V caches come back as the very tensors that went in."""
    model = _model("qwen3_5", layout=DeployLayout.make(cache_len=40))
    states = model.empty_states(2)
    pointers = [t.data_ptr() for t in states]
    logits, new = _step(model, torch.randint(0, 256, (2, 7)), 0, states)
    assert logits.shape == (2, 1, 256)
    for spec, old, t, ptr in zip(model.state_specs(), states, new, pointers):
        if spec.kind in ("key", "value"):
            assert t is old and t.data_ptr() == ptr
            assert t[:, :, :7].abs().sum() > 0 and not t[:, :, 7:].any()


def test_last_logits_are_the_last_real_tokens():
    model = _model("qwen3_next")
    ids = torch.randint(0, 256, (3, 9))
    full = _step(model, ids, 0, model.empty_states(3), lens=[9, 4, 1])[0]
    model.layout = DeployLayout.make(cache_len=160)
    last = _step(model, ids, 0, model.empty_states(3), lens=[9, 4, 1])[0]
    assert last.shape == (3, 1, 256)
    torch.testing.assert_close(last[:, 0], full[torch.arange(3), torch.tensor([8, 3, 0])])


@pytest.mark.parametrize("family", FAMILIES)
def test_ragged_batch_equals_each_row_alone(family):
    """Padding changes no row's states and leaks nowhere: a batch of rows of 1, 40 and 65 tokens
    (right-padded), then decode at each row's own position, equals every row run alone."""
    model = _model(family, seed=3)
    lens, steps = [1, 40, 65], 5
    rows = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)) for n in lens]
    ids = torch.zeros(3, max(lens), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, :len(r)] = r
    model.layout = DeployLayout.make(cache_len=80)

    def generate(ids, lens):
        logits, states = _step(model, ids, 0, model.empty_states(ids.shape[0]), lens=lens)
        out, past = [logits[:, 0]], torch.tensor(lens)
        for _ in range(steps):
            logits, states = _step(model, out[-1].argmax(-1)[:, None], past.tolist(), states)
            out.append(logits[:, 0])
            past += 1
        return torch.stack(out, 1), states

    batched, states = generate(ids, lens)
    for b, row in enumerate(rows):
        alone, alone_states = generate(row[None], [lens[b]])
        torch.testing.assert_close(batched[b], alone[0], atol=1e-4, rtol=0)
        for spec, s, a in zip(model.state_specs(), states, alone_states):
            if spec.kind in ("conv", "recurrent"):
                torch.testing.assert_close(s[b], a[0], atol=1e-5, rtol=0, msg=spec.name)
            else:  # the real slots; the rest are padding and future
                n = lens[b] + steps - 1
                torch.testing.assert_close(s[b, :, :n], a[0, :, :n], atol=1e-5, rtol=0, msg=spec.name)


def test_zero_length_row_sits_the_call_out():
    model = _model("qwen3_5")
    model.layout = DeployLayout.make(cache_len=20)
    _, states = _step(model, torch.randint(0, 256, (2, 4)), 0, model.empty_states(2))
    before = [t.clone() for t in states]
    _, after = _step(model, torch.randint(0, 256, (2, 3)), [4, 4], states, lens=[3, 0])
    for spec, b, a in zip(model.state_specs(), before, after):
        real = (slice(None), slice(0, 4)) if spec.kind in ("key", "value") else ()  # [Hkv, L, D]
        assert torch.equal(a[1][real], b[1][real]), spec.name
        assert not torch.equal(a[0], b[0]), spec.name


def _windowed_visibility(sinks, window):
    """An independent rule for the reference run: causal, and a sink or within the window."""

    def visibility(past_lengths, seq, layout):
        q = past_lengths[:, None, None] + torch.arange(seq)[None, :, None]  # [B, T, 1]
        j = torch.arange(layout.cache_len)[None, None, :]
        return ((j <= q) & ((j < sinks) | (j > q - window)))[:, None]

    return visibility


@pytest.mark.parametrize("sinks,window", [(0, 8), (2, 8), (3, 13)], ids=lambda v: str(v))
def test_streaming_ring_equals_windowed_attention_over_a_long_cache(monkeypatch, sinks, window):
    """Decode far past the window through the S + W ring; the reference keeps every position in a
    long cache and masks it to the sinks and the last W positions (no ring arithmetic)."""
    model = _model("qwen3_5", seed=5)
    B, prompt, steps = 2, 6, 40
    ids = torch.randint(0, 256, (B, prompt))

    def run(layout):
        model.layout = layout
        logits, states = _step(model, ids, 0, model.empty_states(B))
        out = [logits[:, 0]]
        for s in range(steps):
            logits, states = _step(model, out[-1].argmax(-1)[:, None], prompt + s, states)
            out.append(logits[:, 0])
        return torch.stack(out, 1), states

    ring, states = run(DeployLayout.make(sinks=sinks, window=window))
    key = next(t for spec, t in zip(model.state_specs(), states) if spec.kind == "key")
    assert key.shape[2] == sinks + window
    with monkeypatch.context() as m:
        m.setattr(kv_cache, "visibility", _windowed_visibility(sinks, window))
        m.setattr(gated_attention, "decode_shaped", lambda q, key: True)  # every call on the (patched) mask
        reference, _ = run(DeployLayout.make(cache_len=prompt + steps))
    torch.testing.assert_close(ring, reference, atol=1e-4, rtol=0)


def test_streaming_with_a_window_wider_than_the_stream_is_plain_attention():
    model = _model("qwen3_next")
    ids = torch.randint(0, 256, (1, 30))
    model.layout = DeployLayout.make(cache_len=30, logits="all")
    full = _step(model, ids, 0, model.empty_states(1))[0]
    model.layout = DeployLayout.make(sinks=2, window=40, logits="all")
    states, outs = model.empty_states(1), []
    for start in range(0, 30, 7):
        logits, states = _step(model, ids[:, start:start + 7], start, states)
        outs.append(logits)
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-4, rtol=0)


def test_bf16_keeps_recurrent_state_fp32():
    model = _model("qwen3_next")
    ids = torch.randint(0, 256, (2, 20))
    ref = _step(model, ids, 0, model.empty_states(2))[0]
    model.to(torch.bfloat16)
    specs = model.state_specs()
    assert {s.kind: s.dtype for s in specs} == {
        "conv": torch.bfloat16, "recurrent": torch.float32, "key": torch.bfloat16, "value": torch.bfloat16}
    logits, states = _step(model, ids, 0, model.empty_states(2))
    assert logits.dtype == torch.float32
    assert [t.dtype for t in states] == [s.dtype for s in specs]
    rel = (logits - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()
    assert rel < 5e-2, f"bf16 logits drift {rel:.3g} from fp32"


def test_tied_embeddings_share_the_weight():
    model = _model("qwen3_5", tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_bad_states_are_input_errors():
    model = _model("qwen3_5")
    ids = torch.zeros(1, 2, dtype=torch.long)
    states = model.empty_states(1)
    with pytest.raises(InputError, match="expected 8 state tensors"):
        _step(model, ids, 0, states[:-1])
    states[1] = states[1].double()
    with pytest.raises(InputError, match="past.0.recurrent must be float32"):
        _step(model, ids, 0, states)
    states = model.empty_states(1)
    states[0] = torch.zeros(1, 7, 3)
    with pytest.raises(InputError, match=r"past.0.conv must be \('batch', 160, 3\)"):
        _step(model, ids, 0, states)


@pytest.mark.parametrize("past,lens,seq,match", [
    ([159], [2], 2, "exceed the cache of 160 slots"),
    ([-1], [2], 2, "past lengths must be >= 0"),
    ([0], [3], 2, r"row lengths must be in \[0, 2\]"),
    ([0, 0], [2], 2, "past_lengths and seq_lens must both be"),
], ids=["overflow", "negative-past", "len-above-width", "len-count"])
def test_bad_lengths_are_input_errors(past, lens, seq, match):
    model = _model("qwen3_5")
    with pytest.raises(InputError, match=match):
        _step(model, torch.zeros(len(past), seq, dtype=torch.long), past, model.empty_states(len(past)),
              lens=lens)


def test_streaming_call_across_the_ring_end_is_refused():
    model = _model("qwen3_5", layout=DeployLayout.make(sinks=2, window=6))
    _, states = _step(model, torch.zeros(1, 7, dtype=torch.long), 0, model.empty_states(1))
    with pytest.raises(InputError, match="cross the end of the 8-slot streaming cache"):
        _step(model, torch.zeros(1, 2, dtype=torch.long), 7, states)


def test_cache_wrapper_names_states():
    model = _model("qwen3_5")
    cache = Cache(model.state_specs(), model.empty_states(2))
    _, new = _step(model, torch.zeros(2, 5, dtype=torch.long), 0, list(cache))
    cache.update(new)
    assert cache[0, "recurrent"].shape == (2, 4, 16, 24)


def _rss_mib() -> float:
    import resource

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


@pytest.mark.slow
def test_long_stream_runs_in_flat_memory():
    """2000 decode steps, 125 windows past the 16-token ring: the caches stay the same tensors, the
    process does not grow, and the logits stay finite (benchmarks/stream_memory.py runs 30000)."""
    model = _model("qwen3_5", layout=DeployLayout.make(sinks=4, window=16))
    states = model.empty_states(2)
    first = [t.data_ptr() for t in states]
    tok, ones = torch.tensor([[1], [2]]), torch.ones(2, dtype=torch.long)
    rss = {}
    with torch.no_grad():
        for step in range(2000):
            logits, *states = model(tok, torch.full((2,), step), ones, *states)
            tok = logits[:, -1].argmax(-1, keepdim=True)
            if step in (499, 1999):
                rss[step] = _rss_mib()
    assert torch.isfinite(logits).all()
    assert [t.data_ptr() for spec, t in zip(model.state_specs(), states) if spec.kind in ("key", "value")] == \
        [p for spec, p in zip(model.state_specs(), first) if spec.kind in ("key", "value")]
    assert rss[1999] - rss[499] < 16, rss
