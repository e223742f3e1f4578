"""Tiny vision-language checkpoints made by transformers, for the vision-language tests.

Sizes are deliberately unusual: vision hidden 48 with 3 heads of 16, 2 blocks, MLP 40, patch 4,
temporal patch 2, merge 2, a 7 x 7 learned position grid (so grids both smaller and larger than it
are resampled); text hidden 64, head_dim 32 with partial rotary 0.5 (8 frequencies) and
mrope_section [4, 2, 2] (the variant `qwen3_5-default-mrope` has none: transformers'
[11, 11, 10] then, which differs from it at frequency 7), Hv = 2 Hk, Dk != Dv. Placeholder ids
sit inside the 256-token vocab.
Weights transformers initialises to constants (norms, biases, dt_bias) are randomised, so that
every convention is exercised. Models are built once per session and saved with save_pretrained
(sharded safetensors).
"""

from __future__ import annotations

import torch

from tests.onnx._tiny import TWO_LAYERS  # a GDN layer, then attention

IMAGE, VIDEO, START, END = 250, 251, 252, 253
TEXT_VOCAB = 240  # random text tokens stay below the special ids

TEXT = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, num_attention_heads=4, **TWO_LAYERS,
    num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=16, linear_value_head_dim=24, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
    max_position_embeddings=1024, tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                     "mrope_section": [4, 2, 2], "mrope_interleaved": True},
)
VISION = dict(depth=2, hidden_size=48, num_heads=3, intermediate_size=40, out_hidden_size=64,
              patch_size=4, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=49,
              in_channels=3)
TOKENS = dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
              vision_end_token_id=END)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
FAMILIES = ["qwen3_5", "qwen3_5_moe"]
DEFAULT_MROPE = "qwen3_5-default-mrope"
PATCH_DIM = 3 * 2 * 4 * 4


def build_hf(family: str):
    import transformers

    if family == DEFAULT_MROPE:
        rope = {k: v for k, v in TEXT["rope_parameters"].items() if not k.startswith("mrope")}
        config = transformers.Qwen3_5Config(text_config=dict(TEXT, rope_parameters=rope), vision_config=VISION,
                                            **TOKENS)
        model = transformers.Qwen3_5ForConditionalGeneration(config)
    elif family == "qwen3_5":
        config = transformers.Qwen3_5Config(text_config=TEXT, vision_config=VISION, **TOKENS)
        model = transformers.Qwen3_5ForConditionalGeneration(config)
    if family == "qwen3_5_moe":
        text = {k: v for k, v in TEXT.items() if k != "intermediate_size"}
        config = transformers.Qwen3_5MoeConfig(text_config=dict(text, **MOE), vision_config=VISION, **TOKENS)
        model = transformers.Qwen3_5MoeForConditionalGeneration(config)
    randomise(model, seed=1)
    return model.eval()


@torch.no_grad()
def randomise(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen)
        if "visual" in name:
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            elif name.endswith("pos_embed.weight"):
                p.copy_(0.5 * noise)
            else:
                p.copy_(noise * p.shape[-1] ** -0.5 if p.dim() > 1 else noise)
            continue
        if name.endswith("linear_attn.norm.weight"):
            p.copy_(1 + 0.2 * noise)
        elif name.endswith("norm.weight"):
            p.copy_(0.2 * noise)
        elif name.endswith("dt_bias"):
            p.copy_(noise - 2)
        elif name.endswith("mlp.gate.weight"):
            p.copy_(0.3 * noise)
        elif name == "lm_head.weight":
            p.copy_(noise * 64 ** -0.5)
        elif name.endswith("embed_tokens.weight"):
            p.copy_(noise)


_CACHE: dict = {}


def hf_checkpoint(family: str, tmp_path_factory):
    """(transformers model, its save_pretrained directory), built once per session."""
    if family not in _CACHE:
        torch.manual_seed(0)
        hf = build_hf(family)
        directory = tmp_path_factory.mktemp(f"vlm-{family}")
        hf.save_pretrained(directory, max_shard_size="200KB")
        _CACHE[family] = (hf, directory)
    return _CACHE[family]


def pixels(grid, seed: int = 0) -> torch.Tensor:
    """Random pixel_values [sum t*h*w, PATCH_DIM] fp32 for grid [[t, h, w], ...]."""
    n = sum(t * h * w for t, h, w in grid)
    return torch.randn(n, PATCH_DIM, generator=torch.Generator().manual_seed(seed))
