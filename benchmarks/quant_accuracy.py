"""How much accuracy each quantization format costs on a trained checkpoint, through gdn-export's
pipeline and through an independent fake quantization of the same scheme, side by side.

    python benchmarks/quant_accuracy.py CHECKPOINT [--device cuda] [--op-backend triton|reference]
        [--formats fp8,int4-awq,kv-fp8,fp8+kv-fp8,fp8-lm-head] [--windows N] [--prompts N]
        [--prompt-len P] [--new-tokens S] [--calib-samples N] [--out DIR] [--budget SECONDS]

CHECKPOINT is a folder train_small.py wrote (its train_small.json names the held-out split; the
same standard library must be here). Each format is measured twice:

    ours   `gdn-export quantize` (ModelOpt calibration, written and loaded back as a checkpoint) on
           gdn-export's PyTorch model (gdn_export.weights.load_checkpoint), against that model in bf16
           fp8          --format fp8 --kv-cache fp8 with the K/V scales taken off again
           kv-fp8       the 16-bit weights with the K/V scales of that same checkpoint
           fp8+kv-fp8   the checkpoint as written
           int4-awq     --format int4-awq
           fp8-lm-head  --format fp8 --quantize-lm-head, when `gdn-export quantize` has that option
    fake   fake_quant.py on transformers' Qwen3_5ForCausalLM (calibrated in fp32), against that model
           in bf16; int4-rtn (round-to-nearest, groups of 128) is shown beside AWQ

Both sides calibrate on the same rows of the training split (the middle --calib-seq-len tokens of
--calib-samples training files at evenly spaced indices) and are measured on the same held-out
windows and prompts:

    ppl           perplexity of next-token prediction over the held-out windows (each from an empty
                  context), and its change against the same side's bf16 model
    next-token    teacher-forced: the fraction of window positions whose argmax equals the bf16
                  model's argmax on the same inputs
    continuation  free-running: the fraction of --new-tokens greedy tokens after each prompt (a
                  held-out window's first --prompt-len tokens) up to the first one that differs from
                  the bf16 model's greedy continuation, averaged over the prompts

The table (printed last; --out DIR also writes quant_accuracy.md and .json) has one row per format:
both sides' ppl and change, agreements ours / fake, the issue's target for the change, and whether
ours is within TOLERANCE_POINTS of the fake quantization's change (bf16 row: ours against
transformers, the floor of implementation noise).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import io
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stdlib_corpus as corpus  # noqa: E402
from train_small import torch_device  # noqa: E402

FORMATS = ("fp8", "int4-awq", "kv-fp8", "fp8+kv-fp8", "fp8-lm-head")
TARGETS = {"fp8": 2.0, "kv-fp8": 1.0, "int4-awq": 8.0}  # issue 39: at most this many % of perplexity
TOLERANCE_POINTS = 0.1  # "ours not worse than the fake quantization": its change + this many points
RECORD = "train_small.json"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="folder written by benchmarks/train_small.py")
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda when available)")
    p.add_argument("--op-backend", choices=("reference", "triton", "cuda"), default=None,
                   help="gdn-export's op backend (default: triton on CUDA, reference on the CPU)")
    p.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated subset of {', '.join(FORMATS)}")
    p.add_argument("--windows", type=int, default=None, help="held-out windows (default: train_small.json's)")
    p.add_argument("--batch", type=int, default=16, help="windows per forward")
    p.add_argument("--prompts", type=int, default=16, help="prompts of the continuation agreement")
    p.add_argument("--prompt-len", type=int, default=None, help="tokens per prompt (default: a quarter window)")
    p.add_argument("--new-tokens", type=int, default=32, help="greedy tokens after each prompt")
    p.add_argument("--calib-samples", type=int, default=32, help="calibration rows (training files)")
    p.add_argument("--calib-seq-len", type=int, default=None, help="tokens per calibration row (default: a window)")
    p.add_argument("--awq-tokens", type=int, default=2048, help="calibration tokens per Linear for the fake AWQ search")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: torch's; 1 on a shared machine: threads wait on each other)")
    p.add_argument("--out", default=None, help="folder for quant_accuracy.md / .json")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds from the start: formats not started by then are skipped (the table says which)")
    args = p.parse_args(argv)
    args.t0 = time.time()
    ck = Path(args.checkpoint)
    for f in ("config.json", "tokenizer.json", RECORD):
        if not (ck / f).is_file():
            p.error(f"{ck}: no {f} (a folder written by benchmarks/train_small.py is expected)")
    args.record = json.loads((ck / RECORD).read_text())
    here = corpus.describe()
    if here["heldout_digest"] != args.record["corpus"]["heldout_digest"]:
        p.error(f"{ck} was trained on the standard library of Python {args.record['corpus']['python']} "
                f"({args.record['corpus']['root']}); this Python {here['python']} ({here['root']}) splits "
                f"other files: the held-out text would differ")
    args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    bad = [f for f in args.formats if f not in FORMATS]
    if bad:
        p.error(f"--formats: {bad[0]!r} is not one of {', '.join(FORMATS)}")
    seq = args.record["seq_len"]
    args.windows = args.record["heldout"]["windows"] if args.windows is None else args.windows
    args.prompt_len = max(seq // 4, 1) if args.prompt_len is None else args.prompt_len
    args.calib_seq_len = seq if args.calib_seq_len is None else args.calib_seq_len
    for flag in ("windows", "batch", "prompts", "prompt_len", "new_tokens", "calib_samples", "calib_seq_len",
                 "awq_tokens", "threads"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.prompt_len >= seq:
        p.error(f"--prompt-len {args.prompt_len} must be shorter than the windows ({seq} tokens)")
    args.device = torch_device(p, args.device)
    args.op_backend = args.op_backend or ("triton" if args.device.type == "cuda" else "reference")
    if args.op_backend != "reference" and args.device.type != "cuda":
        p.error(f"--op-backend {args.op_backend} needs --device cuda")
    if args.formats:  # every format's gdn-export side goes through `gdn-export quantize`
        try:
            import modelopt  # noqa: F401  (ours: `gdn-export quantize` calibrates with ModelOpt)
        except ImportError as exc:
            p.error(f"gdn-export quantize needs NVIDIA ModelOpt: {exc}")
    return args


# ------------------------------------------------------------------ data
def data(args, tokenizer) -> dict:
    """{"windows" [n, T], "prompts" [N, P], "calib" [n, L]}: int64 arrays (module docstring)."""
    files, T = corpus.split_files(), args.record["seq_len"]
    windows = corpus.heldout_windows(corpus.heldout_stream(tokenizer, T * args.windows), T, args.windows)
    pick = np.linspace(0, len(windows) - 1, min(args.prompts, len(windows))).astype(int)
    train, L = files["train"], args.calib_seq_len
    rows = []
    for i in np.linspace(0, len(train) - 1, args.calib_samples).astype(int):
        ids = np.zeros(0, np.int64)
        for rel in train[i:]:  # a short file joined with its successors
            if ids.size >= L:
                break
            ids = np.concatenate([ids, corpus.encode(tokenizer, corpus.read([rel]))])
        start = max((ids.size - L) // 2, 0)
        if ids.size >= L:
            rows.append(ids[start:start + L])
    if not rows:
        raise SystemExit(f"quant_accuracy: no run of training files holds {L} tokens")
    args.windows, args.prompts = len(windows), len(pick)  # what the table reports: as many as there were
    return {"windows": windows, "prompts": windows[pick, :args.prompt_len], "calib": np.stack(rows)}


# ------------------------------------------------------------------ the two kinds of model
class Ours:
    """gdn-export's HybridForCausalLM: logits of every position, greedy decoding over its states."""

    def __init__(self, model, cache_len: int) -> None:
        from gdn_export.layout import DeployLayout

        model.layout = DeployLayout.make(logits="all", cache_len=cache_len)
        self.model = model

    def _call(self, ids, past: int, states):
        B, T = ids.shape
        dev = ids.device
        out = self.model(ids, torch.full((B,), past, device=dev), torch.full((B,), T, device=dev), *states)
        return out[0].float(), list(out[1:])

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] int64 -> fp32 logits [B, T, V], from empty states."""
        return self._call(ids, 0, self.model.empty_states(ids.shape[0], ids.device))[0]

    def greedy(self, prompts: torch.Tensor, steps: int) -> torch.Tensor:
        """prompts [B, P] int64 -> [B, steps]: the argmax token of each step, fed back."""
        logits, states = self._call(prompts, 0, self.model.empty_states(prompts.shape[0], prompts.device))
        picks = []
        for i in range(steps):
            pick = logits[:, -1].argmax(-1, keepdim=True)
            picks.append(pick)
            if i + 1 < steps:
                logits, states = self._call(pick, prompts.shape[1] + i, states)
        return torch.cat(picks, 1)


class Hf:
    """transformers' Qwen3_5ForCausalLM (or a fake-quantized copy), the same two calls."""

    def __init__(self, model) -> None:
        self.model = model
        # transformers 5.24 names the cache argument and output `cache` (older releases past_key_values)
        self.cache = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] int64 -> fp32 logits [B, T, V]."""
        return self.model(input_ids=ids).logits.float()

    def greedy(self, prompts: torch.Tensor, steps: int) -> torch.Tensor:
        """prompts [B, P] int64 -> [B, steps]: the argmax token of each step, fed back through the
        model's cache (no token suppressed: EOS is a token like the others, as in Ours.greedy)."""
        out = self.model(input_ids=prompts, use_cache=True)
        picks = []
        for i in range(steps):
            pick = out.logits[:, -1].argmax(-1, keepdim=True)
            picks.append(pick)
            if i + 1 < steps:
                out = self.model(input_ids=pick, use_cache=True, **{self.cache: getattr(out, self.cache)})
        return torch.cat(picks, 1)


@torch.no_grad()
def measure(lm, d: dict, args, base: dict | None = None) -> dict:
    """{"ppl", "argmax" [n, T-1], "continuation" [N, S]} over d's windows [n, T] and prompts [N, P]
    and, against a base measurement, `agreement`'s {"next_token", "continuation_agreement",
    "ppl_change"} (module docstring)."""
    dev = args.device
    nll, count, argmax = 0.0, 0, []
    for i in range(0, len(d["windows"]), args.batch):
        ids = torch.as_tensor(d["windows"][i:i + args.batch], device=dev)
        logits = lm.logits(ids)[:, :-1]
        nll += float(F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="sum"))
        count += ids[:, 1:].numel()
        argmax.append(logits.argmax(-1).cpu())
    out = {"ppl": math.exp(nll / count), "argmax": torch.cat(argmax),
           "continuation": lm.greedy(torch.as_tensor(d["prompts"], device=dev), args.new_tokens).cpu()}
    if base is not None:
        out.update(agreement(out, base))
    return out


def agreement(a: dict, b: dict) -> dict:
    """{"next_token", "continuation_agreement", "ppl_change" (%)} of measurement a against b."""
    same = (a["continuation"] == b["continuation"]).int()
    prefix = same.cumprod(1).sum(1).float() / same.shape[1]  # tokens up to the first difference
    return {"next_token": float((a["argmax"] == b["argmax"]).float().mean()),
            "continuation_agreement": float(prefix.mean()), "ppl_change": 100 * (a["ppl"] / b["ppl"] - 1)}


# ------------------------------------------------------------------ ours: gdn-export quantize
def lm_head_option() -> bool:
    """Whether `gdn-export quantize` has --quantize-lm-head."""
    from gdn_export.cli.main import _subparser, make_parser

    return "--quantize-lm-head" in _subparser(make_parser(), "quantize")._option_string_actions


def quantize(args, calib_file: Path, out: Path, fmt: str, *extra: str) -> Path:
    from gdn_export.cli.main import main as cli
    from gdn_export.ops.backends import use_backend

    rows = np.load(calib_file).shape[0]
    argv = ["quantize", str(args.checkpoint), "-o", str(out), "--format", fmt, "--calib-data", str(calib_file),
            "--calib-samples", str(rows), "--calib-seq-len", str(args.calib_seq_len), "--device", str(args.device),
            "-q", *extra]
    with use_backend(args.op_backend), contextlib.redirect_stdout(io.StringIO()):  # its "wrote <temporary folder>"
        code = cli(argv)
    if code != 0:
        raise SystemExit(f"quant_accuracy: gdn-export {' '.join(argv)} exited {code}")
    return out


def quantized_names(model) -> set[str]:
    from gdn_export.modules.quant_linear import QuantLinear

    return {n for n, m in model.named_modules() if isinstance(m, QuantLinear) and "._fused" not in f".{n}"}


# ------------------------------------------------------------------ the run
class Run:
    """One measurement: the data, both bf16 baselines and their measurements, the fake quantization's
    calibration, and gdn-export's quantized checkpoints under `work`."""

    def __init__(self, args, work: Path, say) -> None:
        import transformers
        import fake_quant as fq
        from gdn_export.ops.backends import use_backend
        from gdn_export.weights import load_checkpoint

        self.args, self.work, self.say, self.t0 = args, work, say, args.t0
        self.notes: list[str] = []
        ck, dev = Path(args.checkpoint), args.device
        self.d = data(args, transformers.AutoTokenizer.from_pretrained(ck))
        d = self.d
        self.log(f"{d['windows'].shape[0]} held-out windows of {d['windows'].shape[1]}, {len(d['prompts'])} prompts "
                 f"of {args.prompt_len} + {args.new_tokens}, {len(d['calib'])} calibration rows of "
                 f"{args.calib_seq_len}")
        self.cache_len = max(d["windows"].shape[1], args.prompt_len + args.new_tokens)
        self.calib_file = work / "calib.npy"
        np.save(self.calib_file, d["calib"])
        self.hf16 = transformers.AutoModelForCausalLM.from_pretrained(ck, dtype=torch.bfloat16).to(dev).eval()
        self.base_hf = measure(Hf(self.hf16), d, args)
        self.ours16 = load_checkpoint(ck, device=dev)
        with use_backend(args.op_backend):
            self.base_ours = measure(Ours(self.ours16, self.cache_len), d, args)
        self.log(f"bf16: ppl {self.base_ours['ppl']:.4f} (gdn-export), {self.base_hf['ppl']:.4f} (transformers)")
        hf32 = transformers.AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32).to(dev).eval()
        self.stats = fq.calibrate(hf32, torch.as_tensor(d["calib"]), args.batch, args.awq_tokens)
        self.log(f"fake quantization calibrated: {len(self.stats.amax)} Linears, {len(self.stats.kv_amax)} attention "
                 f"layers")
        self._fp8kv = None

    def log(self, message: str) -> None:
        self.say(f"[{time.time() - self.t0:.0f}s] {message}")

    def ours(self, model) -> dict:
        from gdn_export.ops.backends import use_backend

        with use_backend(self.args.op_backend):
            return measure(Ours(model, self.cache_len), self.d, self.args, self.base_ours)

    def fake(self, model) -> dict:
        return measure(Hf(model), self.d, self.args, self.base_hf)

    def quantized(self, name: str, fmt: str, *extra: str):
        """gdn-export's model of `gdn-export quantize --format fmt *extra` (written under work/name)."""
        from gdn_export.weights import load_checkpoint

        return load_checkpoint(quantize(self.args, self.calib_file, self.work / name, fmt, *extra),
                               device=self.args.device)

    def fp8kv(self):
        """gdn-export's fp8 + FP8 K/V model (one quantize run serves fp8, kv-fp8 and fp8+kv-fp8)."""
        import fake_quant as fq
        from gdn_export.modules.kv_cache_fp8 import kv_scales

        if self._fp8kv is None:
            model = self.quantized("fp8kv", "fp8", "--kv-cache", "fp8")
            self._fp8kv, self.kv_scales = model, kv_scales(model)
            ours, fake = quantized_names(model), set(fq.target_linears(self.hf16))
            if ours != fake:
                self.notes.append(f"fp8: gdn-export quantized {len(ours)} Linears, the fake quantization {len(fake)}; "
                                  f"these differ: {', '.join(sorted(ours ^ fake)[:4])}")
        return self._fp8kv

    def rows(self, fmt: str) -> dict[str, dict]:
        """{row name: {"ours": measurement or None, "fake": measurement}} of one format."""
        import fake_quant as fq
        from gdn_export.modules.kv_cache_fp8 import set_kv_scales

        hf16, stats = self.hf16, self.stats
        if fmt == "fp8":
            model = self.fp8kv()
            set_kv_scales(model, None)
            return {fmt: {"ours": self.ours(model), "fake": self.fake(fq.quantized_copy(hf16, "fp8", stats))}}
        if fmt == "kv-fp8":
            self.fp8kv()
            set_kv_scales(self.ours16, self.kv_scales)
            try:
                ours = self.ours(self.ours16)
            finally:
                set_kv_scales(self.ours16, None)
            return {fmt: {"ours": ours, "fake": self.fake(fq.use_fp8_kv(copy.deepcopy(hf16), fq.kv_scales(stats)))}}
        if fmt == "fp8+kv-fp8":
            model = self.fp8kv()
            set_kv_scales(model, self.kv_scales)
            fake = fq.use_fp8_kv(fq.quantized_copy(hf16, "fp8", stats), fq.kv_scales(stats))
            return {fmt: {"ours": self.ours(model), "fake": self.fake(fake)}}
        if fmt == "int4-awq":
            ours = self.ours(self.quantized("int4", "int4-awq"))
            return {fmt: {"ours": ours, "fake": self.fake(fq.quantized_copy(hf16, "int4-awq", stats))},
                    "int4-rtn": {"ours": None, "fake": self.fake(fq.quantized_copy(hf16, "int4-rtn", stats))}}
        if fmt == "fp8-lm-head":
            fake = self.fake(fq.quantized_copy(hf16, "fp8", stats, lm_head=True))
            if not lm_head_option():
                self.notes.append("fp8-lm-head: `gdn-export quantize` has no --quantize-lm-head yet: gdn-export's "
                                  "side is not measured (the fake quantization's row stands alone)")
                return {fmt: {"ours": None, "fake": fake}}
            return {fmt: {"ours": self.ours(self.quantized("fp8lm", "fp8", "--quantize-lm-head")), "fake": fake}}
        raise ValueError(fmt)


def run(args, say=print, on_row=None) -> dict:
    """{"results": {row: {"ours", "fake"}}, "notes": [...], "seconds"}: every format of args.formats;
    on_row(partial result) after each format."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="quant_accuracy.") as work:
        r = Run(args, Path(work), say)
        results = {"bf16": {"ours": {**r.base_ours, **agreement(r.base_ours, r.base_hf)}, "fake": r.base_hf}}
        if on_row is not None:
            on_row({"results": results, "notes": r.notes, "seconds": time.time() - args.t0})
        for fmt in args.formats:
            if args.budget is not None and time.time() - args.t0 > args.budget:
                r.notes.append(f"{fmt}: not measured, the {args.budget:.0f} s budget was spent")
                continue
            r.log(fmt)
            for name, row in r.rows(fmt).items():
                results[name] = row
                o, f = row["ours"], row["fake"]
                ours = f"{o['ppl']:.4f} ({o['ppl_change']:+.2f}%) gdn-export, " if o else ""
                r.log(f"{name}: ppl {ours}{f['ppl']:.4f} ({f['ppl_change']:+.2f}%) fake quantization")
            if on_row is not None:
                on_row({"results": results, "notes": r.notes, "seconds": time.time() - args.t0})
        return {"results": results, "notes": r.notes, "seconds": time.time() - args.t0}


# ------------------------------------------------------------------ the table
def verdict(fmt: str, ours: dict | None, fake: dict) -> str:
    if ours is None:
        return "-"
    if fmt == "bf16":
        return f"floor {abs(ours['ppl_change']):.2f} pts"
    worse = ours["ppl_change"] - fake["ppl_change"]
    return "yes" if worse <= TOLERANCE_POINTS else f"no (+{worse:.2f} pts)"


def table(res: dict, args) -> str:
    r = args.record
    head = (f"Checkpoint {Path(args.checkpoint).name}: preset {r['preset']}, {r['parameters'] / 1e6:.1f}M parameters, "
            f"{r['tokens_seen'] / 1e6:.1f}M training tokens ({r['device']}); held-out {args.windows} windows of "
            f"{r['seq_len']}; {args.prompts} prompts of {args.prompt_len} + {args.new_tokens} greedy tokens; device "
            f"{args.device}, op backend {args.op_backend}. ours = gdn-export quantize + gdn-export's model against its "
            f"bf16; fake = fake_quant.py on transformers against transformers' bf16 (bf16 row: gdn-export against "
            f"transformers).\n")
    lines = [head, "| format | ppl ours | change ours | ppl fake | change fake | next-token agreement ours / fake "
             "| continuation agreement ours / fake | target | ours within fake + 0.1 pts |",
             "|---|---|---|---|---|---|---|---|---|"]
    for fmt, row in res["results"].items():
        o, f = row["ours"], row["fake"]
        def fmt_change(m):
            return "-" if m is None or "ppl_change" not in m else f"{m['ppl_change']:+.2f}%"
        def agree(m, key):
            return "-" if m is None or key not in m else f"{m[key]:.3f}"
        target = f"<= +{TARGETS[fmt]:.0f}%" if fmt in TARGETS else "-"
        if fmt in TARGETS and o is not None:
            target += " met" if o["ppl_change"] <= TARGETS[fmt] else " missed"
        ppl = "-" if o is None else f"{o['ppl']:.4f}"
        lines.append(f"| {fmt} | {ppl} | {fmt_change(o)} "
                     f"| {f['ppl']:.4f} | {fmt_change(f)} | {agree(o, 'next_token')} / {agree(f, 'next_token')} "
                     f"| {agree(o, 'continuation_agreement')} / {agree(f, 'continuation_agreement')} | {target} "
                     f"| {verdict(fmt, o, f)} |")
    lines += [f"\nNote: {n}" for n in res["notes"]]
    return "\n".join(lines) + "\n"


def write(out: Path, res: dict, args) -> str:
    """The table, written to out/quant_accuracy.md and the measurements to out/quant_accuracy.json."""
    text = table(res, args)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quant_accuracy.md").write_text(text)
    slim = {fmt: {side: None if m is None else {k: v for k, v in m.items() if k not in ("argmax", "continuation")}
                  for side, m in row.items()} for fmt, row in res["results"].items()}
    (out / "quant_accuracy.json").write_text(json.dumps(
        {"record": args.record, "results": slim, "notes": res["notes"], "seconds": res["seconds"]}, indent=2))
    return text


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    out = Path(args.out) if args.out else None
    res = run(args, say=lambda m: print(m, file=sys.stderr, flush=True),
              on_row=None if out is None else lambda partial: write(out, partial, args))
    print(write(out, res, args) if out is not None else table(res, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
