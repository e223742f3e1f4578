"""`gdn-export run CHECKPOINT --speculative K`: generation with the checkpoint's MTP head drafting K
tokens a round and the model verifying them in one call (gdn_export.runtime.speculative); `run
model.onnx --speculative K`: the same over the graphs `export --speculative K` wrote beside it
(model.verify.onnx, model.mtp.onnx) in ONNX Runtime (gdn_export.runtime.ort_speculative)."""

from __future__ import annotations

import math
from pathlib import Path

from gdn_export.cli.args import add_seed
from gdn_export.errors import InputError


def add_arguments(p) -> None:
    p.add_argument("--speculative", type=int, default=None, metavar="K",
                   help="speculative decoding: the checkpoint's multi-token-prediction head drafts K "
                   "tokens a round (1..16), the model verifies them in one call; greedy output equal to "
                   "plain greedy decoding (a Qwen3.5 / Qwen3.5-MoE / Qwen3-Next checkpoint with mtp.* "
                   "tensors, or model.onnx with the model.verify.onnx and model.mtp.onnx that `export "
                   "--speculative K` wrote beside it, run in ONNX Runtime; default: off)")
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
    if backend not in ("torch", "ort"):
        raise InputError(f"--speculative runs a checkpoint folder (torch) or the exported graphs (ort); "
                         f"{args.model} runs on {backend}")
    if args.save_logits:
        raise InputError("--save-logits is not kept with --speculative (the verify calls' logits are "
                         "not one per step)")
    if backend == "ort":
        if args.device not in (None, "cpu"):
            raise InputError(f"--speculative over the exported graphs runs ONNX Runtime on the CPU, not "
                             f"--device {args.device}")
        if args.prefill_chunk is not None:
            raise InputError("--prefill-chunk does not apply to --speculative over the exported graphs (the "
                             "verify graph prefills in windows of K + 1 tokens)")
        _ort_graphs(args)
        return

    from gdn_export.hf_config import read_config
    from gdn_export.weights.mtp import check_has_mtp

    check_has_mtp(read_config(Path(args.model) / "config.json"), args.model)


def _ort_paths(model) -> tuple[Path, Path, Path]:
    """(model.onnx, model.verify.onnx, model.mtp.onnx) for `model` (model.onnx, or its verify graph)."""
    from gdn_export.onnx.speculative import speculative_paths

    model = Path(model)
    stem = model.with_name(model.name[:-len(".verify.onnx")] + ".onnx") if model.name.endswith(".verify.onnx") \
        else model
    return (stem, *speculative_paths(stem))


def _ort_graphs(args) -> None:
    """InputError unless the verify and head graphs lie beside args.model with their roles and the K
    asked for (their metadata read, not their weights)."""
    import onnx
    from google.protobuf.message import DecodeError

    from gdn_export.onnx import metadata

    stem, verify, mtp = _ort_paths(args.model)
    for path, role in ((verify, "verify"), (mtp, "mtp")):
        if not path.is_file():
            raise InputError(f"--speculative with {args.model} runs {path.name} beside it, which is missing "
                             f"(`gdn-export export CHECKPOINT -o {stem.name} --speculative K` writes it)")
        try:
            props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
        except DecodeError as exc:
            raise InputError(f"{path}: not an ONNX model ({exc})") from None
        if props.get(metadata.KEY_SPECULATIVE_ROLE) != role:
            raise InputError(f"{path}: not the {role} graph of `export --speculative`")
        if role == "verify" and int(props.get(metadata.KEY_SPECULATIVE_K, 0)) != args.speculative:
            raise InputError(f"{path.name} verifies K = {props.get(metadata.KEY_SPECULATIVE_K)} drafts a round; "
                             f"run it with --speculative {props.get(metadata.KEY_SPECULATIVE_K)} (or export "
                             f"again with --speculative {args.speculative})")


def run_ort(args, ids, progress) -> int:
    """--speculative over the exported graphs in ONNX Runtime; prints as `run`."""
    from gdn_export.runtime.ort_speculative import OrtSpeculativeDecoder

    _, verify, mtp = _ort_paths(args.model)  # checked by check_flags
    decoder = OrtSpeculativeDecoder(verify, mtp, temperature=args.temperature, seed=args.seed,
                                    kernels=args.ort_kernels)
    mode = "greedy" if args.temperature == 0 else f"sampling at temperature {args.temperature:g}"
    progress(f"ort: {decoder.kernels_note}; speculative decoding of {args.max_new_tokens} new tokens, K = "
             f"{decoder.k} drafts from {mtp.name}, verified by {verify.name}, {mode}")
    result = decoder.generate(ids, args.max_new_tokens)
    for row in result.rows():
        print(" ".join(str(int(t)) for t in row))
    progress(f"{result.rounds} rounds, {result.tokens_per_step:.2f} tokens per verify step (drafts "
             f"accepted: {result.acceptance_rate:.1%})")
    return 0


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
