"""Speculative decoding with the checkpoint's MTP head against plain decoding, on one GPU, one call.

    python3 benchmarks/spec_bench.py CHECKPOINT [--batches 1,8] [--k 1,2,3,4] [--prompt-len 256]
        [--new-tokens 128] [--rows 8] [--dtype bf16] [--op-backend triton] [--repeats 3] [--text FILE ...]
        [--out DIR] [--dry-run]

CHECKPOINT is a trained Qwen3.5 / Qwen3.5-MoE / Qwen3-Next folder with its `mtp.*` head (random
weights accept nothing), e.g. `benchmarks/train_small.py OUT --preset gpu --mtp`. For each batch
size the model is loaded once on a GraphRunner (CUDA graphs, fused projections); plain greedy
decoding is timed (gdn_export.runtime.bench.bench_runner), then for each K greedy speculative
decoding on the same runner and prompts (gdn_export.runtime.spec_bench.bench_speculative): tokens/s
and the speedup, tokens per verify step (the mean accepted length), the draft acceptance rate, the
round, draft and verify times against a plain step, and whether the tokens equal plain greedy's.
Acceptance depends on the text: each batch size runs ceil(--rows / B) sets of B prompts (8 prompts
one at a time at batch 1, not one), plain and speculative on each set; tokens/s are all the sets'
tokens over their summed median decode times, tokens/step and acceptance are weighted by rounds,
rows = plain counts every row of every set.

Prompts are text the model has not been trained on: --text files, else the held-out files of
benchmarks/stdlib_corpus.py (train_small.py's split) when it is there, else this Python's standard
library; tokenized with CHECKPOINT/tokenizer.json, one window of --prompt-len tokens per row from
a different place. --dry-run makes a tiny random checkpoint with a head and runs the whole script
on the CPU with small sizes (acceptance meaningless there). The table is printed last; --out also
keeps it (spec_bench.md) with every number (spec_bench.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be integers separated by commas, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be integers >= 1, got {text!r}")
    return values


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", nargs="?", help="trained checkpoint folder with mtp.* tensors")
    p.add_argument("--batches", type=_ints, default=[1, 8], help="batch sizes (default 1,8)")
    p.add_argument("--k", type=_ints, default=[1, 2, 3, 4], help="drafts a round to time (default 1,2,3,4)")
    p.add_argument("--prompt-len", type=int, default=256, help="prompt tokens per row (default 256)")
    p.add_argument("--new-tokens", type=int, default=128, help="decoded tokens per row (default 128)")
    p.add_argument("--rows", type=int, default=8,
                   help="prompts per batch size at least: ceil(ROWS / B) sets of B (default 8)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--op-backend", choices=("triton", "cuda", "reference"), default=None,
                   help="default: triton on the GPU, reference on the CPU")
    p.add_argument("--repeats", type=int, default=3, help="timed runs, medians (default 3)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--text", action="append", default=[], metavar="FILE", help="prompt text files")
    p.add_argument("--device", default=None, help="default: cuda if present, else cpu")
    p.add_argument("--out", type=Path, help="folder for spec_bench.md / .json")
    p.add_argument("--dry-run", action="store_true", help="a tiny random checkpoint on the CPU, small sizes")
    args = p.parse_args(argv)
    if args.dry_run:
        args.batches, args.k, args.prompt_len, args.new_tokens, args.rows = [1, 2], [1, 2], 12, 6, 2
        args.repeats, args.warmup, args.dtype, args.device = 1, 0, "fp32", args.device or "cpu"
    elif args.checkpoint is None:
        p.error("CHECKPOINT is required (or --dry-run)")
    for name in ("prompt_len", "new_tokens", "repeats", "rows"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if max(args.k) > 16:
        p.error("--k values must be in [1, 16]")
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return args


def prompt_texts(files: list[str]) -> list[str]:
    """The texts prompts are cut from (module docstring)."""
    if files:
        return [Path(f).read_text(encoding="utf-8", errors="replace") for f in files]
    try:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import stdlib_corpus

        return stdlib_corpus.read(stdlib_corpus.split_files()["heldout"])
    except ImportError:
        root = Path(sysconfig.get_paths()["stdlib"])
        return [p.read_text(encoding="utf-8", errors="replace") for p in sorted(root.glob("*.py"))[:80]]
    finally:
        sys.path.pop(0)


def make_prompts(checkpoint: Path, files: list[str], rows: int, length: int, vocab: int, seed: int = 0):
    """[rows, length] int64 windows of tokenized text (random ids without a tokenizer), and where from."""
    rng = np.random.default_rng(seed)
    tokenizer = checkpoint / "tokenizer.json"
    if not tokenizer.is_file():
        return rng.integers(0, vocab, (rows, length)), "random ids (no tokenizer.json)"
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    stream = np.concatenate([np.array(tok.encode(t).ids, np.int64) for t in prompt_texts(files) if t.strip()])
    if len(stream) < rows * length:
        raise SystemExit(f"the prompt text has {len(stream)} tokens; {rows} x {length} are needed")
    starts = np.sort(rng.choice(len(stream) - length, rows, replace=False))
    return np.stack([stream[s:s + length] for s in starts]), f"{len(stream)} tokens of held-out text"


def run(args) -> list[dict]:
    from gdn_export.cli.common import torch_dtype
    from gdn_export.layout import DeployLayout
    from gdn_export.runtime import bench as B
    from gdn_export.runtime.cuda_graph import GraphRunner
    from gdn_export.weights import load_checkpoint
    from gdn_export.weights.mtp import load_mtp

    device = torch.device(args.device)
    op_backend = args.op_backend or ("triton" if device.type == "cuda" else "reference")
    checkpoint = Path(args.checkpoint)
    rows = []
    for batch in args.batches:
        t0 = time.time()
        model = load_checkpoint(checkpoint, dtype=torch_dtype(args.dtype), device=device)
        model.layout = DeployLayout.make(cache_len=args.prompt_len + args.new_tokens + 1 + 2 * max(args.k))
        mtp = load_mtp(checkpoint, model)
        runner = GraphRunner(model, device=device, op_backend=op_backend)
        sets = -(-args.rows // batch)
        windows, source = make_prompts(checkpoint, args.text, batch * sets, args.prompt_len, model.config.vocab_size)
        plains, wants = [], []
        for prompts in np.split(windows, sets):
            ids = torch.from_numpy(prompts).to(device)
            plains.append(B.bench_runner(runner, ids, args.new_tokens, args.warmup, args.repeats))
            logits, states = runner.prefill_device(ids, runner.empty_states(batch))
            first = logits[:, -1].argmax(-1)[:, None]
            picked, _, _ = runner.decode_greedy(first, np.full(batch, args.prompt_len, np.int64), states,
                                                args.new_tokens)
            wants.append(np.concatenate([first.cpu().numpy(), picked.cpu().numpy()], 1))
        plain_ms = float(np.mean([p.decode_ms_per_step for p in plains]))
        plain_tps = batch * args.new_tokens * sets / sum(p.decode_ms_per_step * args.new_tokens for p in plains) * 1e3
        print(f"B{batch}: plain {plain_ms:.3f} ms/step over {sets} set(s) of prompts ({source}, loaded in "
              f"{time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
        for k in args.k:
            row = {"batch": batch, "k": k, "sets": sets, "plain_tokens_per_s": plain_tps, "plain_step_ms": plain_ms,
                   "prompts": source, **_over_sets(runner, mtp, np.split(windows, sets), wants, k, args)}
            row["speedup"] = row["decode_tokens_per_s"] / row["plain_tokens_per_s"]
            row["verify_over_plain"] = row["verify_ms"] / row["plain_step_ms"]
            row["ceiling"] = (k + 1) / row["verify_over_plain"]
            rows.append(row)
            print(f"B{batch} K{k}: {row['decode_tokens_per_s']:.1f} tokens/s ({row['speedup']:.2f}x), "
                  f"{row['tokens_per_step']:.2f} tokens/step, rows equal to plain: {row['rows_equal_plain']}/"
                  f"{batch * sets}"
                  + ("" if row.get("first_difference") is None else
                     f" (first difference at token {row['first_difference']}, row {row['difference_row']}: top-2 "
                     f"logit gap {row['difference_gap']:.4f} at logit {row['difference_logit']:.2f}, the speculative "
                     f"token ranked {row['difference_rank']})"),
                  file=sys.stderr, flush=True)
        del runner, model, mtp
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _over_sets(runner, mtp, sets: list, wants: list, k: int, args) -> dict:
    """bench_speculative on every set of prompts, combined (module docstring); the first differing
    set's difference_margin keys."""
    from gdn_export.runtime.spec_bench import agreement, bench_speculative, difference_margin

    runs, equal, margin = [], 0, {}
    for prompts, want in zip(sets, wants):
        spec = bench_speculative(runner, mtp, prompts, k, args.new_tokens, args.warmup, args.repeats)
        generated = spec.pop("generated")
        same = agreement(generated, want)
        equal += same["rows_equal_plain"]
        if not margin and same["first_difference"] is not None:
            margin = {**same, **difference_margin(runner, prompts, generated, want)}
        runs.append(spec)
    rounds = sum(r["rounds"] for r in runs)
    tokens = len(sets) * sets[0].shape[0] * args.new_tokens
    out = {"rounds": rounds, "decode_ms": sum(r["decode_ms"] for r in runs),
           "tokens_per_step": sum(r["tokens_per_step"] * r["rounds"] for r in runs) / max(rounds, 1),
           "acceptance_rate": sum(r["acceptance_rate"] * r["rounds"] for r in runs) / max(rounds, 1),
           "rows_equal_plain": equal, "tokens_equal_plain": equal == len(sets) * sets[0].shape[0],
           "first_difference": None, "per_set_tokens_per_step": [r["tokens_per_step"] for r in runs]}
    out["decode_tokens_per_s"] = tokens / out["decode_ms"] * 1e3
    for key in ("prefill_ms", "round_ms", "draft_ms", "verify_ms"):
        out[key] = float(np.mean([r[key] for r in runs]))
    out["round_ms"] = out["decode_ms"] / max(rounds, 1)
    out.update({key: value for key, value in margin.items() if key != "rows_equal_plain"})
    out["cuda_graph"] = runs[0]["cuda_graph"]
    return out


def table(rows: list[dict], args, device_name: str) -> str:
    head = (f"{args.checkpoint}, {args.dtype}, {device_name}, prompt {args.prompt_len}, {args.new_tokens} new "
            f"tokens, greedy, at least {args.rows} prompts per batch size, medians of {args.repeats} "
            f"({time.strftime('%Y-%m-%d')})")
    lines = [head, "", "| B | K | plain tok/s | spec tok/s | speedup | tokens/step | accepted | plain step ms "
             "| round ms | draft ms | verify ms | verify/plain | ceiling | rows = plain |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['k']} | {r['plain_tokens_per_s']:.1f} | {r['decode_tokens_per_s']:.1f} "
                     f"| {r['speedup']:.2f}x | {r['tokens_per_step']:.2f} | {r['acceptance_rate']:.1%} "
                     f"| {r['plain_step_ms']:.3f} | {r['round_ms']:.3f} | {r['draft_ms']:.3f} | {r['verify_ms']:.3f} "
                     f"| {r['verify_over_plain']:.2f} | {r['ceiling']:.2f}x | {r['rows_equal_plain']}/{r['batch'] * r['sets']} |")
    lines.append("\ntokens/step: tokens a verify step gave a row (accepted drafts + 1); ceiling: (K + 1) x plain "
                 "step / verify, the speedup with every draft accepted and free drafts; rows = plain: rows whose "
                 "tokens equal plain greedy decoding's throughout")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        from gdn_export.weights import make_tiny_checkpoint

        tmp = tempfile.TemporaryDirectory()
        args.checkpoint = str(make_tiny_checkpoint(Path(tmp.name) / "ckpt", family="qwen3_5", mtp_layers=1))
    rows = run(args)
    name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    text = table(rows, args, name)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "spec_bench.md").write_text(text + "\n", encoding="utf-8")
        (args.out / "spec_bench.json").write_text(json.dumps(rows, indent=2, default=str), encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
