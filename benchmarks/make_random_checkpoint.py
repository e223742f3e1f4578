"""Write a random Qwen3.5 text checkpoint of real size with transformers (for e2e_bench.sh).

    python benchmarks/make_random_checkpoint.py DIR --size 1.6b|9b [--device cuda] [--seed 0]
                                                [--layers N] [--vocab V]

1.6b: 24 layers (3 Gated DeltaNet : 1 gated attention), hidden 2048, intermediate 6144, GDN Hk 16 /
Hv 32 of Dk = Dv = 128, 16 query / 2 KV heads of head_dim 256 (rope on 64 channels), vocab 248320,
tied embeddings: 1.66B parameters besides the embedding (2.17B with it). 9b: Qwen3.5-9B-like shapes
(32 layers, hidden 4096, intermediate 12288, 16 / 4 heads of 256, same GDN heads, untied).
Weights are made on `device` in bf16 from a seeded generator (transformers' own init), with the
constants transformers initialises (norm weights, dt_bias) spread out so that they matter, then
saved with save_pretrained (safetensors). Prints the parameter counts. --layers / --vocab override the
size's layer count (a multiple of 4 keeps the 3 : 1 pattern) and vocabulary with every per-layer shape
kept (quant_gpu.sh LAYERS=N: fewer layers with the vocabulary cut by the same factor keep the 16-bit
embedding / lm_head's share of the weight bytes).
"""

from __future__ import annotations

import argparse
import time

import torch

SIZES = {
    "1.6b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=24, num_attention_heads=16,
                 num_key_value_heads=2, tie_word_embeddings=True),
    "9b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=32, num_attention_heads=16,
               num_key_value_heads=4, tie_word_embeddings=False),
}
COMMON = dict(vocab_size=248320, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32,
              linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
              full_attention_interval=4, rms_norm_eps=1e-6, max_position_embeddings=32768,
              rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0,
                               "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]})


@torch.no_grad()
def make(directory: str, size: str, device: str, seed: int, layers: int | None = None,
         vocab: int | None = None) -> None:
    import transformers

    t0 = time.perf_counter()
    over = {k: v for k, v in (("num_hidden_layers", layers), ("vocab_size", vocab)) if v is not None}
    config = transformers.Qwen3_5TextConfig(**{**COMMON, **SIZES[size], **over})
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = transformers.Qwen3_5ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32)
        if name.endswith("linear_attn.norm.weight"):
            p.copy_(1 + 0.2 * noise)
        elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            p.copy_(0.2 * noise)
        elif name.endswith("dt_bias"):
            p.copy_(noise - 2)
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    total = sum(p.numel() for p in model.parameters())
    embed = model.model.embed_tokens.weight.numel()
    print(f"{size}: {total / 1e9:.3f}B parameters ({(total - embed) / 1e9:.3f}B without the embedding; "
          f"tied lm_head: {config.tie_word_embeddings}), made in {time.perf_counter() - t0:.1f} s")
    model.save_pretrained(directory)
    print(f"saved to {directory} in {time.perf_counter() - t0:.1f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("directory")
    p.add_argument("--size", choices=SIZES, default="1.6b")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=None, help="layer count (default: the size's)")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: 248320)")
    args = p.parse_args()
    for flag, value in (("--layers", args.layers), ("--vocab", args.vocab)):
        if value is not None and value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    make(args.directory, args.size, args.device, args.seed, args.layers, args.vocab)


if __name__ == "__main__":
    main()
