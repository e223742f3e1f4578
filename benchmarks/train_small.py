"""Train a small Qwen3.5-shaped language model on the Python standard library's sources and save it
as a Hugging Face folder: the trained checkpoint that quant_accuracy.py (and the speculative-decoding
work, with --mtp) measures on.

    python benchmarks/train_small.py OUT --preset gpu|cpu|tiny [--minutes M] [--steps N] [--mtp]
                                      [--device cuda|cpu] [--seed 0] [--overwrite]

The model is transformers' own Qwen3_5ForCausalLM (3 Gated DeltaNet : 1 gated-attention layers,
partial rotary 0.25, tied embeddings), trained with torch AdamW (betas 0.9 / 0.95, weight decay 0.1
on matrices), bf16 autocast on a GPU (fp32 on the CPU), gradient clipping at 1.0, a linear warm-up
over the first 3% then a cosine decay to 10% of the peak, both over the run's fraction done (time or
steps, whichever bound is nearer): the loop stops at --minutes (or --steps). Batches are random
windows of the training stream (stdlib_corpus: held-out files by a crc32 rule, byte-level BPE
trained on the training files with `tokenizers`).

Presets (parameters with the tied embedding):
    gpu   hidden 768, 12 layers, MLP 2304; GDN 6 key / 12 value heads of 128 (the 1.66B's 16 / 32 of
          128, and its key width = hidden, scaled to hidden 768); attention 8 query / 2 KV heads of
          256 with the output gate; vocab 8192; windows of 512, batch 32; 129M parameters; 4.5 min
    cpu   hidden 256, 4 layers, MLP 768; GDN 2 / 4 heads of 64; attention 2 / 1 heads of 128; vocab
          2048; windows of 128, batch 16; ~3.9M parameters; 10 min
    tiny  hidden 128, 4 layers; vocab 300; a few steps (tests)

--mtp trains Qwen3.5's multi-token-prediction head beside the model (mtp_head.py: fc over
[norm(embedding of the next token); norm(hidden)], one full-attention decoder layer, shared lm_head;
loss weight MTP_WEIGHT on predicting token t+2, gradients into the main model as in joint MTP
training), then, for the last --mtp-distill of the run (a fraction of its time or steps, default
0.2), trains the head alone (the model frozen) towards the model's own distribution over token t+2:
what a speculative round accepts is the model's choice, not the text's (cpu preset, 10 minutes on
2 cores: the head agrees with the model's top-1 at 0.71 of held-out positions against 0.52 without
the phase, at 34.9 against 34.5 held-out perplexity) and writes it as `mtp.*` tensors into model.safetensors with mtp_num_hidden_layers 1 in
config.json (transformers and gdn-export skip them when loading the main model).

OUT gets config.json, model.safetensors (bf16), generation_config.json, tokenizer.json and
tokenizer_config.json (ChatML template), and train_small.json: the preset, the corpus record
(stdlib_corpus.describe), tokens seen, steps, seconds, the final training loss and the held-out
perplexity of the saved bf16 weights (and the MTP head's held-out top-1 accuracy). The folder is
written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stdlib_corpus as corpus  # noqa: E402

PRESETS = {
    "gpu": dict(model=dict(hidden_size=768, intermediate_size=2304, num_hidden_layers=12, num_attention_heads=8,
                           num_key_value_heads=2, head_dim=256, linear_num_key_heads=6, linear_num_value_heads=12,
                           linear_key_head_dim=128, linear_value_head_dim=128),
                vocab=8192, seq_len=512, batch=32, lr=1.5e-3, minutes=4.5, eval_windows=256, eval_batch=32),
    "cpu": dict(model=dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=2,
                           num_key_value_heads=1, head_dim=128, linear_num_key_heads=2, linear_num_value_heads=4,
                           linear_key_head_dim=64, linear_value_head_dim=64),
                vocab=2048, seq_len=128, batch=16, lr=3e-3, minutes=10.0, eval_windows=64, eval_batch=16),
    "tiny": dict(model=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                            linear_key_head_dim=16, linear_value_head_dim=16),
                 vocab=300, seq_len=32, batch=4, lr=3e-3, minutes=1.0, eval_windows=4, eval_batch=4,
                 train_bytes=300_000),
}
COMMON = dict(linear_conv_kernel_dim=4, full_attention_interval=4, rms_norm_eps=1e-6, tie_word_embeddings=True,
              max_position_embeddings=32768, initializer_range=0.02,
              rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25})
MTP_WEIGHT = 0.3
# Fraction of the run (time or steps) at its end that trains the MTP head alone towards the model's
# own distribution over token t+2 (the model frozen), at DISTILL_LR of the peak learning rate.
MTP_DISTILL = 0.2
DISTILL_LR = 1 / 3
WARMUP = 0.03
FINAL_LR = 0.1  # of the peak
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
CLIP = 1.0
RECORD = "train_small.json"


def model_config(preset: str, vocab: int):
    """transformers.Qwen3_5TextConfig of a preset with `vocab` entries."""
    import transformers

    shapes = PRESETS[preset]["model"]
    # The mrope sections split the rotary half-width (head_dim * 0.25 / 2) in three, as Qwen3.5's
    # [11, 11, 10] of 32 does; text positions are the same in all three.
    half = int(shapes["head_dim"] * COMMON["rope_parameters"]["partial_rotary_factor"]) // 2
    base, rem = divmod(half, 3)
    rope = {**COMMON["rope_parameters"], "mrope_section": [base + (rem > 0), base + (rem > 1), base]}
    return transformers.Qwen3_5TextConfig(**{**COMMON, **shapes, "rope_parameters": rope}, vocab_size=vocab,
                                          eos_token_id=0, pad_token_id=0, bos_token_id=None)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="folder to write (config.json, model.safetensors, tokenizer files, train_small.json)")
    p.add_argument("--preset", choices=PRESETS, required=True)
    p.add_argument("--minutes", type=float, default=None, help="training-loop time bound (default: the preset's)")
    p.add_argument("--steps", type=int, default=None, help="step bound (default: none, the time bound alone)")
    p.add_argument("--mtp", action="store_true", help="train Qwen3.5's MTP head beside the model (mtp.* tensors)")
    p.add_argument("--mtp-distill", type=float, default=MTP_DISTILL, metavar="F",
                   help=f"--mtp: fraction in [0, 1) of the run, at its end, that trains the MTP head alone "
                        f"towards the model's own next-token distribution, the model frozen (default "
                        f"{MTP_DISTILL}; 0: none)")
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda when available)")
    p.add_argument("--batch", type=int, default=None, help="windows per step (default: the preset's)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: torch's; 1 on a shared machine: threads wait on each other)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    args = p.parse_args(argv)
    pre = PRESETS[args.preset]
    args.minutes = pre["minutes"] if args.minutes is None else args.minutes
    args.batch = pre["batch"] if args.batch is None else args.batch
    if not args.minutes > 0:
        p.error(f"--minutes must be > 0, got {args.minutes}")
    if not 0 <= args.mtp_distill < 1:
        p.error(f"--mtp-distill must be in [0, 1), got {args.mtp_distill}")
    for flag, v in (("--steps", args.steps), ("--batch", args.batch), ("--threads", args.threads)):
        if v is not None and v < 1:
            p.error(f"{flag} must be >= 1, got {v}")
    args.device = torch_device(p, args.device)
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        p.error(f"{out} exists (give --overwrite to replace it)")
    if out.exists() and not out.is_dir():
        p.error(f"{out} exists and is not a folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    if not os.access(out.parent, os.W_OK):
        p.error(f"{out.parent} is not writable")
    return args


def torch_device(parser: argparse.ArgumentParser, name: str | None) -> torch.device:
    """--device as a torch.device (default: cuda when available); a usage error for a name torch
    does not know or a GPU it does not see."""
    try:
        dev = torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError:
        parser.error(f"--device {name!r} is not a torch device (cpu, cuda, cuda:1, ...)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {name}: torch sees no CUDA GPU here")
    return dev


def lr_factor(done: float) -> float:
    """Learning-rate factor at fraction `done` of the run: linear warm-up, then cosine to FINAL_LR."""
    if done < WARMUP:
        return max(done / WARMUP, 1e-3)
    t = min((done - WARMUP) / (1 - WARMUP), 1.0)
    return FINAL_LR + (1 - FINAL_LR) * 0.5 * (1 + math.cos(math.pi * t))


def optimizer(params, lr: float) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms, biases, A_log, dt_bias)."""
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    fused = all(p.is_cuda for p in params)
    return torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=BETAS, fused=fused)


def losses(model, mtp, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(next-token CE, MTP CE or None) on windows ids [B, T + 2]: the model reads tokens 0..T-1."""
    from mtp_head import mtp_logits

    x = ids[:, :-2]
    hidden = model.model(input_ids=x).last_hidden_state
    logits = model.lm_head(hidden)
    main = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:-1].flatten())
    if mtp is None:
        return main, None
    side = mtp_logits(model, mtp, ids[:, 1:-1], hidden)  # tokens 1..T with h_0..h_{T-1} -> 2..T+1
    return main, F.cross_entropy(side.float().flatten(0, 1), ids[:, 2:].flatten())


def distill_loss(model, mtp, ids: torch.Tensor) -> torch.Tensor:
    """The head-only phase's loss on windows ids [B, T + 2]: cross-entropy of the head's logits for
    token t+2 against the model's own distribution over it (its logits at t+1, positions 0..T-2;
    the model run without gradients)."""
    from mtp_head import mtp_logits

    with torch.no_grad():
        hidden = model.model(input_ids=ids[:, :-2]).last_hidden_state
        target = model.lm_head(hidden)[:, 1:].float().softmax(-1)
    side = mtp_logits(model, mtp, ids[:, 1:-1], hidden).float()
    return -(target * side[:, :-1].log_softmax(-1)).sum(-1).mean()


@torch.no_grad()
def evaluate(model, mtp, windows: np.ndarray, batch: int, device) -> dict:
    """{"ppl", "tokens", "mtp_top1"?, "mtp_agree"?}: perplexity of next-token prediction over windows
    [n, T] (each window from an empty context); the MTP head's top-1 accuracy on token t+2 given the
    true t+1, and how often its top-1 is the model's own top-1 for token t+2 there (what a greedy
    speculative round accepts, had the text been the model's)."""
    from mtp_head import mtp_logits

    nll, count, hits, agree, mtp_count = 0.0, 0, 0, 0, 0
    for i in range(0, len(windows), batch):
        ids = torch.as_tensor(windows[i:i + batch], device=device)
        hidden = model.model(input_ids=ids).last_hidden_state
        logits = model.lm_head(hidden).float()
        nll += float(F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="sum"))
        count += ids[:, 1:].numel()
        if mtp is not None:
            side = mtp_logits(model, mtp, ids[:, 1:-1], hidden[:, :-2])  # tokens 1..T-2 -> 2..T-1
            hits += int((side.argmax(-1) == ids[:, 2:]).sum())
            agree += int((side.argmax(-1) == logits[:, 1:-1].argmax(-1)).sum())
            mtp_count += ids[:, 2:].numel()
    out = {"ppl": math.exp(nll / count), "tokens": count}
    if mtp is not None:
        out["mtp_top1"], out["mtp_agree"] = hits / mtp_count, agree / mtp_count
    return out


def train(args, say=print) -> dict:
    """Train per args; returns the run record (the saved folder is written by `save`)."""
    import transformers
    from mtp_head import MtpHead

    pre = PRESETS[args.preset]
    t_start = time.time()
    torch.manual_seed(args.seed)
    files = corpus.split_files()
    train = corpus.read(files["train"], max_bytes=pre.get("train_bytes"))
    tok = corpus.train_tokenizer(train, pre["vocab"])
    train_ids = corpus.encode(tok, train)
    T, n = pre["seq_len"], pre["eval_windows"]
    heldout = corpus.heldout_windows(corpus.heldout_stream(tok, T * n), T, n)
    say(f"[{time.time() - t_start:.0f}s] corpus: {len(train)} training files, {train_ids.size} tokens; "
        f"{len(files['heldout'])} held-out files, {heldout.size} evaluation tokens; vocab {tok.get_vocab_size()}")

    config = model_config(args.preset, tok.get_vocab_size())
    dev = args.device
    model = transformers.Qwen3_5ForCausalLM(config).to(dev)
    mtp = MtpHead(config).to(dev) if args.mtp else None
    params = list(model.parameters()) + (list(mtp.parameters()) if mtp is not None else [])
    n_params = sum(p.numel() for p in model.parameters())
    say(f"model: {n_params / 1e6:.2f}M parameters ({(n_params - model.model.embed_tokens.weight.numel()) / 1e6:.2f}M "
        f"without the embedding){'; MTP head %.2fM' % (sum(p.numel() for p in mtp.parameters()) / 1e6) if mtp else ''}")
    opt = optimizer(params, pre["lr"])
    gen = torch.Generator().manual_seed(args.seed)
    stream = torch.from_numpy(train_ids)
    B = args.batch
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda"
                else torch.autocast("cpu", enabled=False))
    budget = args.minutes * 60
    if dev.type == "cuda":  # the fp32 matmuls of transformers' GDN fallback on tensor cores while training
        torch.set_float32_matmul_precision("high")
    model.train()
    step, seen, t0, loss_avg, mtp_avg = 0, 0, time.time(), None, None
    # the head-only phase: from this fraction of the run on (module docstring, --mtp-distill)
    distill_from = 1 - args.mtp_distill if mtp is not None and args.mtp_distill > 0 else None
    distill_steps, distill_avg = 0, None
    while True:
        done = (time.time() - t0) / budget
        if args.steps is not None:
            done = max(done, step / args.steps)
        if done >= 1:
            break
        distilling = distill_from is not None and done >= distill_from
        if distilling and distill_steps == 0:  # the model frozen; the head gets an optimizer of its own
            for p in model.parameters():
                p.requires_grad_(False)
            params = list(mtp.parameters())
            opt = optimizer(params, pre["lr"] * DISTILL_LR)
            say(f"[{time.time() - t_start:.0f}s] step {step}: the MTP head alone, towards the model's own "
                f"next-token distribution, for the last {args.mtp_distill:.0%} of the run")
        if distilling:  # linear decay to FINAL_LR over the phase
            left = (1 - done) / args.mtp_distill
            factor = DISTILL_LR * (FINAL_LR + (1 - FINAL_LR) * left)
        else:
            factor = lr_factor(done)
        for g in opt.param_groups:
            g["lr"] = pre["lr"] * factor
        starts = torch.randint(0, stream.numel() - T - 2, (B,), generator=gen)
        ids = torch.stack([stream[s:s + T + 2] for s in starts.tolist()]).to(dev, non_blocking=True)
        with autocast:
            if distilling:
                main, side = None, distill_loss(model, mtp, ids)
            else:
                main, side = losses(model, mtp, ids)
        loss = side if main is None else main if side is None else main + MTP_WEIGHT * side
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        step += 1
        seen += B * T
        distill_steps += int(distilling)
        if step % 10 == 1 or step < 10:  # a host sync every 10 steps only
            if main is not None:
                m = main.item()
                loss_avg = m if loss_avg is None else 0.9 * loss_avg + 0.1 * m
            if side is not None:
                s = side.item()
                if distilling:
                    distill_avg = s if distill_avg is None else 0.9 * distill_avg + 0.1 * s
                else:
                    mtp_avg = s if mtp_avg is None else 0.9 * mtp_avg + 0.1 * s
        if step % 100 == 0:
            side_loss = f", mtp loss {mtp_avg:.3f}" if mtp_avg is not None else ""
            side_loss += f", distill loss {distill_avg:.3f}" if distill_avg is not None else ""
            say(f"[{time.time() - t_start:.0f}s] step {step}, {seen / 1e6:.1f}M tokens, loss {loss_avg:.3f}"
                f"{side_loss}, lr {opt.param_groups[0]['lr']:.2e}")
    train_s = time.time() - t0
    torch.set_float32_matmul_precision("highest")  # measurements in full fp32, as quant_accuracy.py's
    say(f"[{time.time() - t_start:.0f}s] trained: {step} steps, {seen / 1e6:.2f}M tokens in {train_s:.0f} s "
        f"({seen / max(train_s, 1e-9) / 1e3:.1f}k tokens/s), loss {loss_avg:.3f}")
    record = {"preset": args.preset, "seed": args.seed, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda"
              else "cpu", "torch": torch.__version__, "transformers": transformers.__version__,
              "corpus": corpus.describe(), "parameters": n_params, "steps": step, "tokens_seen": seen,
              "batch": B, "seq_len": T, "train_seconds": round(train_s, 1), "final_train_loss": loss_avg,
              "mtp": None if mtp is None else {"weight": MTP_WEIGHT, "final_train_loss": mtp_avg,
                                               "distill": {"fraction": args.mtp_distill, "steps": distill_steps,
                                                           "final_loss": distill_avg}}}
    return {"record": record, "model": model.eval(), "mtp": None if mtp is None else mtp.eval(), "tokenizer": tok,
            "heldout": heldout, "eval_batch": pre["eval_batch"], "device": dev}


def save(out: Path, trained: dict, overwrite: bool, say=print) -> Path:
    """Write the folder (see the module docstring) under a temporary name, measure the held-out
    perplexity of the weights as saved (reloaded by transformers), then rename it to out."""
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers.utils import logging as hf_logging
    from mtp_head import state_dict

    hf_logging.disable_progress_bar()
    out = Path(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model, mtp, record = trained["model"], trained["mtp"], trained["record"]
        model.config.dtype = "bfloat16"
        model.to(torch.bfloat16).save_pretrained(tmp)
        # the chat template inside tokenizer_config.json, as Qwen's releases have it
        corpus.hf_tokenizer(trained["tokenizer"]).save_pretrained(tmp, save_jinja_files=False)
        if mtp is not None:
            weights = tmp / "model.safetensors"
            tensors = load_file(weights)
            tensors.update(state_dict(mtp, torch.bfloat16))
            save_file(tensors, weights, metadata={"format": "pt"})
            cfg = json.loads((tmp / "config.json").read_text())
            cfg["mtp_num_hidden_layers"] = 1
            (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
            mtp.to(torch.bfloat16)
        saved = transformers.Qwen3_5ForCausalLM.from_pretrained(tmp, dtype=torch.bfloat16).to(trained["device"]).eval()
        result = evaluate(saved, mtp, trained["heldout"], trained["eval_batch"], trained["device"])
        say(f"held-out perplexity of the saved bf16 weights: {result['ppl']:.3f} over {result['tokens']} tokens"
            + (f"; MTP top-1 on token t+2: {result['mtp_top1']:.3f}, the model's top-1: {result['mtp_agree']:.3f}"
               if mtp is not None else ""))
        record["heldout"] = {"ppl": result["ppl"], "tokens": result["tokens"], "windows": len(trained["heldout"])}
        if mtp is not None:
            record["mtp"]["heldout_top1"] = result["mtp_top1"]
            record["mtp"]["heldout_agree"] = result["mtp_agree"]
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        for f in tmp.iterdir():
            f.chmod(0o644)
        tmp.chmod(0o755)
        if out.exists() and overwrite:
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    trained = train(args, say)
    path = save(Path(args.out), trained, args.overwrite, say)
    r = trained["record"]
    print(f"wrote {path}: {r['parameters'] / 1e6:.2f}M parameters, {r['tokens_seen'] / 1e6:.2f}M tokens, "
          f"held-out perplexity {r['heldout']['ppl']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
