"""Parity with Hugging Face transformers, the independent oracle.

Tiny random models of every supported model type (Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration,
Qwen3NextForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration, OlmoHybridForCausalLM
with rope and NoPE) are built in transformers from config dicts (Hv = 2 Hk, Dk != Dv), their
conventions exercised by randomising the weights transformers initialises to constants (norm
weights, dt_bias), saved with save_pretrained as sharded safetensors, and loaded with
load_checkpoint. The prefill logits and those of 8 greedy decode
steps (transformers drives its own cache; we feed the same tokens and our flat states) agree in
fp32 to 1e-4, for prompt lengths that are not multiples of the chunk size 64. The families added
with OLMo-Hybrid and Qwen3.5-MoE are also exported to ONNX and run in ONNX Runtime against the same
transformers logits.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from gdn_export.layout import DeployLayout  # noqa: E402
from gdn_export.weights import load_checkpoint  # noqa: E402

ORT_CASES = ["qwen3_5_moe_text", "qwen3_5_moe", "olmo_hybrid", "olmo_hybrid-nope"]

BATCH, STEPS, ATOL = 2, 8, 1e-4
PROMPTS = [1, 63, 130]

TEXT = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=16, linear_value_head_dim=24, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
    max_position_embeddings=1024, tie_word_embeddings=False,
)
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}


def _qwen3_5_text():
    config = transformers.Qwen3_5TextConfig(**TEXT, rope_parameters=dict(ROPE, mrope_section=[1, 1, 0]))
    return transformers.Qwen3_5ForCausalLM(config)


def _qwen3_5_composite():
    config = transformers.Qwen3_5Config(
        text_config=dict(TEXT, rope_parameters=dict(ROPE, mrope_section=[1, 1, 0], mrope_interleaved=True)),
        vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64),
    )
    return transformers.Qwen3_5ForConditionalGeneration(config)


def _qwen3_next():
    config = transformers.Qwen3NextConfig(
        **TEXT, rope_parameters=ROPE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
    )
    return transformers.Qwen3NextForCausalLM(config)


MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)


def _qwen3_5_moe_text():
    text = {k: v for k, v in TEXT.items() if k != "intermediate_size"}
    config = transformers.Qwen3_5MoeTextConfig(**text, **MOE, rope_parameters=dict(ROPE, mrope_section=[1, 1, 0]))
    return transformers.Qwen3_5MoeForCausalLM(config)


def _qwen3_5_moe_composite():
    text = {k: v for k, v in TEXT.items() if k != "intermediate_size"}
    config = transformers.Qwen3_5MoeConfig(
        text_config=dict(text, **MOE, rope_parameters=dict(ROPE, mrope_section=[1, 1, 0], mrope_interleaved=True)),
        vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64),
    )
    return transformers.Qwen3_5MoeForConditionalGeneration(config)


def _olmo_hybrid(rope_theta=10000.0):
    # OLMo has no head_dim field (hidden / heads = 16) and its own layer-type default.
    text = {k: v for k, v in TEXT.items() if k != "head_dim"}
    config = transformers.OlmoHybridConfig(
        **text, rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        pad_token_id=None, eos_token_id=None, linear_allow_neg_eigval=True,
    )
    return transformers.OlmoHybridForCausalLM(config)


BUILDERS = {
    "qwen3_5_text": _qwen3_5_text, "qwen3_5": _qwen3_5_composite, "qwen3_next": _qwen3_next,
    "qwen3_5_moe_text": _qwen3_5_moe_text, "qwen3_5_moe": _qwen3_5_moe_composite,
    "olmo_hybrid": _olmo_hybrid, "olmo_hybrid-nope": lambda: _olmo_hybrid(rope_theta=None),
}


@torch.no_grad()
def _randomise(model, seed):
    """Move the weights transformers sets to constants, so that conventions are exercised."""
    gen = torch.Generator().manual_seed(seed)
    plain_norms = type(model).__name__.startswith("Olmo")  # scale w (centred on 1), not 1 + w
    for name, p in model.named_parameters():
        if "visual" in name:
            continue
        noise = torch.randn(p.shape, generator=gen)
        if name.endswith("linear_attn.norm.weight") or name.endswith("linear_attn.o_norm.weight"):
            p.copy_(1 + 0.2 * noise)  # gated norm: scale w
        elif name.endswith("norm.weight"):
            p.copy_(0.2 * noise + (1.0 if plain_norms else 0.0))
        elif name.endswith("dt_bias"):
            p.copy_(noise - 2)
        elif name.endswith("mlp.gate.weight"):
            p.copy_(0.3 * noise)  # spread the router
        elif name == "lm_head.weight":
            p.copy_(noise * 64**-0.5)  # logits of order 1


_PAIRS: dict[str, tuple] = {}


def _pair(case, tmp_path_factory):
    if case not in _PAIRS:
        _PAIRS[case] = _build_pair(case, tmp_path_factory)
    return _PAIRS[case]


@pytest.fixture(scope="module", params=list(BUILDERS), ids=list(BUILDERS))
def pair(request, tmp_path_factory):
    """(transformers model, our model loaded from its save_pretrained directory)."""
    return _pair(request.param, tmp_path_factory)


def _build_pair(case, tmp_path_factory):
    torch.manual_seed(0)
    hf = BUILDERS[case]().eval()
    _randomise(hf, seed=1)
    directory = tmp_path_factory.mktemp(case)
    hf.save_pretrained(directory, max_shard_size="100KB")
    assert (directory / "model.safetensors.index.json").is_file()
    ours = load_checkpoint(directory)
    assert ours.config.model_type == case.removesuffix("-nope")
    assert ours.config.use_rope == (not case.endswith("-nope"))
    return hf, ours


@pytest.mark.parametrize("prompt", PROMPTS, ids=lambda t: f"prompt{t}")
@torch.no_grad()
def test_prefill_and_decode_match_transformers(pair, prompt):
    hf, ours = pair
    ids = torch.randint(0, 256, (BATCH, prompt), generator=torch.Generator().manual_seed(prompt))
    hf_out = hf(input_ids=ids, use_cache=True)
    ours.layout = DeployLayout.make(cache_len=prompt + STEPS, logits="all")
    lens = torch.full((BATCH,), prompt)
    logits, *states = ours(ids, torch.zeros(BATCH, dtype=torch.long), lens, *ours.empty_states(BATCH))
    diffs = [(hf_out.logits - logits).abs().max().item()]
    cache = hf_out.cache
    for step in range(STEPS):
        token = hf_out.logits[:, -1].argmax(-1, keepdim=True)
        hf_out = hf(input_ids=token, cache=cache, use_cache=True)
        cache = hf_out.cache
        logits, *states = ours(token, torch.full((BATCH,), prompt + step), torch.ones(BATCH, dtype=torch.long),
                               *states)
        diffs.append((hf_out.logits - logits).abs().max().item())
    assert max(diffs) <= ATOL, f"max |logits diff| per step (prefill first): {diffs}"
    assert hf_out.logits.std() > 0.3  # the comparison is not between near-constant logits


@pytest.fixture(scope="module", params=ORT_CASES, ids=ORT_CASES)
def ort_pair(request, tmp_path_factory):
    """(transformers model, OrtRunner of our export of the same checkpoint)."""
    from gdn_export.onnx import export_onnx
    from gdn_export.runtime.ort_runner import OrtRunner

    hf, ours = _pair(request.param, tmp_path_factory)
    # every position's logits, as transformers gives them (not left to whichever test set the shared
    # model's layout before this fixture ran)
    ours.layout = DeployLayout.make(cache_len=max(PROMPTS) + STEPS, logits="all")
    path = export_onnx(ours, tmp_path_factory.mktemp(f"onnx-{request.param}") / "model.onnx")
    return hf, OrtRunner(path)


@pytest.mark.parametrize("prompt", PROMPTS, ids=lambda t: f"prompt{t}")
@torch.no_grad()
def test_onnxruntime_matches_transformers(ort_pair, prompt):
    hf, runner = ort_pair
    ids = torch.randint(0, 256, (BATCH, prompt), generator=torch.Generator().manual_seed(prompt))
    hf_out = hf(input_ids=ids, use_cache=True)
    logits, states = runner.forward(ids.numpy(), 0, runner.empty_states(BATCH))
    diffs = [(hf_out.logits - torch.from_numpy(logits)).abs().max().item()]
    cache = hf_out.cache
    for step in range(STEPS):
        token = hf_out.logits[:, -1].argmax(-1, keepdim=True)
        hf_out = hf(input_ids=token, cache=cache, use_cache=True)
        cache = hf_out.cache
        logits, states = runner.forward(token.numpy(), prompt + step, states)
        diffs.append((hf_out.logits - torch.from_numpy(logits)).abs().max().item())
    assert max(diffs) <= ATOL, f"max |logits diff| per step (prefill first): {diffs}"
