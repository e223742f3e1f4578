"""`gdn-export run CHECKPOINT --speculative K`: generation with the checkpoint's MTP head drafting K
tokens a round and the model verifying them in one call (gdn_export.runtime.speculative)."""

from __future__ import annotations

import math

from gdn_export.cli.args import add_seed
from gdn_export.errors import InputError


def add_arguments(p) -> None:
    p.add_argument("--speculative", type=int, default=None, metavar="K",
                   help="speculative decoding: the checkpoint's multi-token-prediction head drafts K "
                   "tokens a round (1..16), the model verifies them in one call; greedy output equal to "
                   "plain greedy decoding (torch backend, Qwen3.5 / Qwen3.5-MoE / Qwen3-Next checkpoints "
                   "with mtp.* tensors; default: off)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="with --speculative: sample at this temperature (the rejection rule keeps the "
                   "model's own distribution); 0 = greedy (default 0)")
    add_seed(p, "the sampling with --speculative and --temperature > 0")


def check_flags(args, backend: str) -> None:
    """InputError for a speculative flag that cannot apply, before any work."""
    if args.speculative is None:
        if args.temperature:
            raise InputError("--temperature applies to --speculative (plain run decodes greedily)")
        return
    if not 1 <= args.speculative <= 16:
        raise InputError(f"--speculative must be in [1, 16], got {args.speculative}")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise InputError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if backend != "torch":
        raise InputError(f"--speculative runs a checkpoint folder on the torch backend; {args.model} runs "
                         f"on {backend}")
    if args.save_logits:
        raise InputError("--save-logits is not kept with --speculative (the verify calls' logits are "
                         "not one per step)")
    from pathlib import Path

    from gdn_export.hf_config import read_config
    from gdn_export.weights.mtp import check_has_mtp

    check_has_mtp(read_config(Path(args.model) / "config.json"), args.model)


def run(args, ids, progress) -> int:
    """Generate with --speculative; prints one line per row (prompt, then the new tokens)."""
    from gdn_export.cli.runners import open_runner
    from gdn_export.layout import DeployLayout
    from gdn_export.runtime.base import as_prompts
    from gdn_export.runtime.memory import check_generation_memory
    from gdn_export.runtime.speculative import SpeculativeDecoder, cache_slots_needed
    from gdn_export.weights.mtp import load_mtp

    k, n = args.speculative, args.max_new_tokens
    slots = cache_slots_needed(max(len(p) for p in ids), n, k)
    runner = open_runner(args.model, "torch", dtype=args.dtype or "fp32", device=args.device or "cpu",
                         op_backend=args.op_backend, layout=DeployLayout.make(cache_len=slots))
    prompts = as_prompts(ids, runner.vocab_size)
    check_generation_memory(runner, prompts, slots - max(len(p) for p in prompts), keep_logits=False)
    mtp = load_mtp(args.model, runner.model)
    decoder = SpeculativeDecoder(runner, mtp, k, temperature=args.temperature, seed=args.seed)
    mode = "greedy" if args.temperature == 0 else f"sampling at temperature {args.temperature:g}"
    progress(f"torch: prefill {len(prompts)} rows, then speculative decoding of {n} new tokens, K = {k} "
             f"drafts from the MTP head, {mode}")
    result = decoder.generate(prompts, n, prefill_chunk=args.prefill_chunk)
    for row in result.rows():
        print(" ".join(str(int(t)) for t in row))
    progress(f"{result.rounds} rounds, {result.tokens_per_step:.2f} tokens per verify step (drafts "
             f"accepted: {result.acceptance_rate:.1%})")
    return 0
