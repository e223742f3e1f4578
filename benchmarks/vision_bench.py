"""Vision-language speed on one GPU: gdn-export's fast GPU runtime vs transformers, side by side.

    PYTHONPATH=$PWD python3 benchmarks/vision_bench.py [--size 9b|2b|tiny] [--dtype bf16]
        [--repeats 10] [--warmup 3] [--out DIR] [--checkpoint-dir DIR] [--device cuda]
        [--op-backend triton|cuda]

A checkpoint is made by transformers from a real-size Qwen3.5 config with random weights (no
download): `9b` is Qwen3_5Config's defaults (text hidden 4096, 32 layers; vision 27 blocks of 1152,
patch 16, merge 2), `2b` a smaller text model with the same vision tower, `tiny` a CPU smoke size.
It is saved once to --checkpoint-dir/checkpoint-SIZE (default --out) and loaded by both sides in --dtype.

Rows (median ms over --repeats after --warmup untimed runs, CUDA-synchronised wall time):
    vision 1 x 1024x1024     the vision encoder on one 1024x1024 image (as the image processor
                             resizes it: 64 x 64 patches, 1024 placeholder tokens)
    vision 8 x 448x448       the vision encoder on a batch of 8 448x448 images (28 x 28 patches each)
    TTFT 1024x1024 + text    time to first token: vision encoder + prefill of a prompt holding one
                             1024x1024 image and 32 text tokens + the first token's argmax
Columns: ours (VisionEncoder + HybridVLForCausalLM, --op-backend kernels, eager per-frame SDPA in
the vision tower), transformers (Qwen3_5ForConditionalGeneration, sdpa attention), ratio
transformers / ours (> 1: ours is faster). Before timing, ours is checked against transformers on
the same inputs (relative RMS of the visual features and of the first-token logits, reported).
JSON and the markdown table go to --out (default $OUT, else a new temp folder); the table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gdn_export.vlm.positions import VisualTokens, build_prompt, token_kinds, visual_call  # noqa: E402
from records import out_dir  # noqa: E402

SIZES = {
    "9b": dict(text={}, vision={}),
    "2b": dict(text=dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2,
                         intermediate_size=6144, linear_num_value_heads=16),
               vision=dict(out_hidden_size=2048)),
    "tiny": dict(text=dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=32, intermediate_size=96, linear_num_key_heads=2, linear_num_value_heads=4,
                           linear_key_head_dim=16, linear_value_head_dim=24, vocab_size=256),
                 vision=dict(depth=2, hidden_size=64, num_heads=4, intermediate_size=96, out_hidden_size=64),
                 tokens=dict(image_token_id=250, video_token_id=251, vision_start_token_id=252,
                             vision_end_token_id=253)),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def make_checkpoint(size: str, out: Path) -> Path:
    import transformers

    path = out / f"checkpoint-{size}"
    if (path / "config.json").is_file():
        return path
    spec = SIZES[size]
    config = transformers.Qwen3_5Config(text_config=spec["text"], vision_config=spec["vision"],
                                        **spec.get("tokens", {}))
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = transformers.Qwen3_5ForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(path)
    del model
    return path


def patches_for(width: int, height: int, vision_config) -> tuple[int, int]:
    from gdn_export.vlm.build import patch_grid

    return patch_grid(width, height, vision_config, {"max_pixels": 4096 * 4096})


def timed(fn, device, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        runs.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(runs)


def rel_rms(a, b) -> float:
    a, b = torch.as_tensor(a).double().cpu(), torch.as_tensor(b).double().cpu()
    return float("inf") if torch.isnan(a).any() else ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=list(SIZES), default="9b")
    ap.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--op-backend", choices=("triton", "cuda", "reference"), default="triton")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--text-tokens", type=int, default=32)
    ap.add_argument("--out", default=None, help="JSON and table (default $OUT, else a new temp folder)")
    ap.add_argument("--checkpoint-dir", default=None,
                    help="where the random checkpoint is written once and reused (default --out; the 9b "
                    "one takes ~19 GB)")
    args = ap.parse_args()
    args.out = out_dir(args.out, "vision_bench")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]

    import transformers

    from gdn_export.ops.backends import use_backend
    from gdn_export.vlm.weights import load_language, load_vision

    ckpt = make_checkpoint(args.size, Path(args.checkpoint_dir) if args.checkpoint_dir else out)
    print(f"checkpoint {ckpt}", file=sys.stderr)
    vision = load_vision(ckpt, dtype=dtype).to(device)
    lm = load_language(ckpt, dtype=dtype, device=device)
    hf = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(ckpt, dtype=dtype,
                                                                     attn_implementation="sdpa").to(device).eval()
    c = vision.config
    tokens = VisualTokens.from_config(c)
    gen = torch.Generator().manual_seed(0)

    def pixels(grid):
        n = sum(t * h * w for t, h, w in grid)
        return torch.randn(n, c.patch_dim, generator=gen).to(device=device, dtype=dtype)

    big = patches_for(1024, 1024, c)
    small = patches_for(448, 448, c)
    cases = {"vision 1 x 1024x1024": [[1, *big]], "vision 8 x 448x448": [[1, *small]] * 8}
    rows, checks = [], {}
    backend = use_backend(args.op_backend) if device.type == "cuda" else use_backend("reference")
    with torch.no_grad(), backend:
        for name, grid in cases.items():
            pv, g = pixels(grid), torch.tensor(grid, device=device)
            ours = vision(pv, g)
            theirs = torch.cat(hf.model.get_image_features(pv, g).pooler_output)
            checks[name] = rel_rms(ours.float(), theirs.float())
            t_ours = timed(lambda: vision(pv, g), device, args.warmup, args.repeats)
            t_hf = timed(lambda: hf.model.get_image_features(pv, g), device, args.warmup, args.repeats)
            rows.append((name, t_ours, t_hf))

        # time to first token: one 1024x1024 image + text
        grid = [[1, *big]]
        text = np.random.default_rng(0).integers(0, min(1000, c.image_token_id), args.text_tokens)
        prompt = build_prompt(text, grid, [], tokens)
        call = visual_call([prompt], len(prompt), grid, [], tokens)
        pv, g = pixels(grid), torch.tensor(grid, device=device)
        from gdn_export.layout import DeployLayout

        lm.layout = DeployLayout.make(cache_len=len(prompt) + 8)
        lm.check_inputs = False
        ids = torch.from_numpy(prompt)[None].to(device)
        zero, lens = torch.zeros(1, dtype=torch.long, device=device), torch.tensor([len(prompt)], device=device)
        positions = torch.from_numpy(call.rope_positions).to(device)
        index = torch.from_numpy(call.visual_index).to(device)

        def ours_ttft():
            feats = vision(pv, g)
            logits, *_ = lm(ids, zero, lens, positions, feats, index, *lm.empty_states(1))
            return logits[0, -1].argmax()

        kinds = torch.from_numpy(token_kinds(prompt, tokens))[None].to(device)

        def hf_ttft():
            hf.model.rope_deltas = None
            out_ = hf(input_ids=ids, pixel_values=pv, image_grid_thw=g, mm_token_type_ids=kinds, use_cache=True,
                      logits_to_keep=1)
            return out_.logits[0, -1].argmax()

        feats = vision(pv, g)
        ours_logits, *_ = lm(ids, zero, lens, positions, feats, index, *lm.empty_states(1))
        hf.model.rope_deltas = None
        hf_logits = hf(input_ids=ids, pixel_values=pv, image_grid_thw=g, mm_token_type_ids=kinds,
                       logits_to_keep=1).logits
        checks["TTFT logits"] = rel_rms(ours_logits[0, -1].float(), hf_logits[0, -1].float())
        name = f"TTFT 1024x1024 + {args.text_tokens} text ({len(prompt)} tokens)"
        rows.append((name, timed(ours_ttft, device, args.warmup, args.repeats),
                     timed(hf_ttft, device, args.warmup, args.repeats)))

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result = {"size": args.size, "dtype": args.dtype, "device": gpu, "op_backend": args.op_backend,
              "repeats": args.repeats, "grids": {"1024x1024": big, "448x448": small},
              "rel_rms_vs_transformers": checks,
              "rows": [{"case": n, "ours_ms": a, "transformers_ms": b, "speedup": b / a} for n, a, b in rows]}
    (out / f"vision_bench_{args.size}.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"Qwen3.5 {args.size} (random weights), {args.dtype}, {gpu}, op backend {args.op_backend}, "
             f"median of {args.repeats}",
             "", "| case | ours (ms) | transformers (ms) | transformers / ours |", "|---|---:|---:|---:|"]
    lines += [f"| {n} | {a:.2f} | {b:.2f} | {b / a:.2f}x |" for n, a, b in rows]
    lines += ["", "relative RMS vs transformers: " + ", ".join(f"{k} {v:.2e}" for k, v in checks.items())]
    table = "\n".join(lines)
    (out / f"vision_bench_{args.size}.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
