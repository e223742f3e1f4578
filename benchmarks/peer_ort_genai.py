"""Our export vs onnxruntime-genai 0.18's model builder on random Qwen3.5 checkpoints made by transformers.

    python -m venv /tmp/peer && echo /path/to/shared/venv/site-packages > /tmp/peer/lib/python3.11/site-packages/shared.pth
    /tmp/peer/bin/pip install onnxruntime-genai==0.18.0           # only that package lands in /tmp/peer
    PYTHONPATH=$PWD python benchmarks/peer_ort_genai.py --peer-python /tmp/peer/bin/python [--hidden 256]
        [--layers 4] [--prompt 64] [--steps 16] [--forms gdn,standard,ort] [--device cpu|cuda]
        [--out docs/perf/peer_ort_genai.md]

Makes a random `Qwen3_5ForConditionalGeneration` (transformers, seeded, tiny vision tower) and saves it;
then (1) gdn-export: export fp32 (the gdn form; the standard and ort forms rewritten from it,
docs/onnx_forms.md), time it, file size, OrtRunner prefill and decode per step, greedy tokens, a row
per form; (2) the peer: `python -m onnxruntime_genai.models.builder -i CKPT -o OUT -p fp32 -e cpu`
(`-e cuda` with --device cuda: onnxruntime-genai-cuda in the peer venv, onnxruntime-gpu in ours) in
the peer interpreter, time, size of its files, then its own generator (og.Model / og.Generator,
greedy) timed per step; (3) transformers' greedy tokens as the truth. Where the peer's build or run
fails, its error (last line) goes into the table instead of numbers.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PEER_RUN = r"""
import json, sys, time
import numpy as np
import onnxruntime_genai as og
model_dir, ids, steps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
model = og.Model(model_dir)
params = og.GeneratorParams(model)
params.set_search_options(do_sample=False, max_length=len(ids) + steps)
gen = og.Generator(model, params)
t0 = time.perf_counter(); gen.append_tokens(np.array([ids], dtype=np.int32)); prefill = time.perf_counter() - t0
times, out = [], []
while not gen.is_done() and len(out) < steps:
    t0 = time.perf_counter(); gen.generate_next_token(); times.append(time.perf_counter() - t0)
    out.append(int(gen.get_next_tokens()[0]))
print(json.dumps(dict(prefill=prefill, decode=float(np.median(times)) if times else None, tokens=out)))
"""


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def make_checkpoint(folder: Path, hidden: int, layers: int, seed: int = 0) -> Path:
    import torch
    import transformers

    torch.manual_seed(seed)
    heads = max(hidden // 64, 2)
    text = dict(vocab_size=1024, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=48,
                linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=4096,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                 "mrope_section": [4, 4, 0], "mrope_interleaved": True})
    config = transformers.Qwen3_5Config(text_config=text, vision_config=dict(
        depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=hidden))
    model = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    with torch.no_grad():  # transformers' init leaves norms at 1 / 0: spread them so they matter
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    return folder


def transformers_greedy(folder: Path, ids: list[int], steps: int) -> list[int]:
    import torch
    import transformers

    model = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False)
    return out[0, len(ids):].tolist()


def ours(folder: Path, work: Path, ids: list[int], steps: int, forms=("gdn",), device: str = "cpu") -> dict:
    """{form: row} of our export in each form (the gdn file exported, the others rewritten from it)."""
    import shutil

    import torch

    from gdn_export.layout import DeployLayout
    from gdn_export.onnx import export_onnx
    from gdn_export.onnx.export import rewrite_form
    from gdn_export.weights import load_checkpoint

    t0 = time.perf_counter()
    model = load_checkpoint(folder, dtype=torch.float32)
    model.layout = DeployLayout.make(cache_len=len(ids) + steps + 1)
    gdn = export_onnx(model, work / "ours.onnx")
    export_s = time.perf_counter() - t0
    rows = {}
    for form in forms:
        t0 = time.perf_counter()
        path = gdn
        if form != "gdn":
            path = work / f"ours-{form}.onnx"
            shutil.copyfile(gdn, path)
            rewrite_form(path, form)
        rows[form] = _time_ours(path, export_s + time.perf_counter() - t0, ids, steps, device)
    return rows


def _time_ours(path: Path, export_s: float, ids: list[int], steps: int, device: str) -> dict:
    from gdn_export.runtime.ort_runner import OrtRunner

    runner = OrtRunner(path, device=device)
    arr = np.array([ids], np.int64)
    t0 = time.perf_counter()
    logits, states = runner.forward(arr, 0, runner.empty_states(1))
    prefill = time.perf_counter() - t0
    times, tokens = [], []
    token = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
    tokens.append(int(token[0, 0]))
    for i in range(steps - 1):
        t0 = time.perf_counter()
        logits, states = runner.forward(token, len(ids) + i, states)
        times.append(time.perf_counter() - t0)
        token = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
        tokens.append(int(token[0, 0]))
    return dict(export_s=export_s, bytes=_size(path), prefill=prefill, decode=float(np.median(times)),
                tokens=tokens, note=runner.kernels_note)


def peer(python: str, folder: Path, work: Path, ids: list[int], steps: int, device: str = "cpu") -> dict:
    out_dir = work / "peer"
    t0 = time.perf_counter()
    build = subprocess.run([python, "-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o", str(out_dir),
                            "-p", "fp32", "-e", device, "-c", str(work / "peer_cache")],
                           capture_output=True, text=True, timeout=1800)
    export_s = time.perf_counter() - t0
    if build.returncode != 0:
        return dict(error=f"builder failed: {_last_line(build.stderr + build.stdout)}", export_s=export_s)
    result = dict(export_s=export_s, bytes=_size(out_dir))
    run = subprocess.run([python, "-c", PEER_RUN, str(out_dir), json.dumps(ids), str(steps)],
                         capture_output=True, text=True, timeout=1800)
    if run.returncode != 0:
        result["error"] = f"run failed: {_last_line(run.stderr + run.stdout)}"
        return result
    result.update(json.loads(run.stdout.strip().splitlines()[-1]))
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer-python", required=True, help="python of the venv holding onnxruntime-genai")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--forms", default="gdn,standard,ort", help="our forms to time (docs/onnx_forms.md)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--out", help="also write the Markdown table here")
    args = p.parse_args(argv)
    forms = [f for f in args.forms.split(",") if f]
    from gdn_export.onnx.forms import check_form

    for form in forms:
        check_form(form)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folder = make_checkpoint(work / "ckpt", args.hidden, args.layers)
        ids = np.random.default_rng(0).integers(0, 1024, args.prompt).tolist()
        truth = transformers_greedy(folder, ids, args.steps)
        rows = {f"gdn-export, {form} form": r for form, r in
                ours(folder, work, ids, args.steps, forms, args.device).items()}
        rows["onnxruntime-genai 0.18 builder"] = peer(args.peer_python, folder, work, ids, args.steps, args.device)
    lines = [f"| random Qwen3_5ForConditionalGeneration, hidden {args.hidden}, {args.layers} layers, fp32, "
             f"ORT {args.device.upper()} "
             f"| export (s) | files (MiB) | prefill {args.prompt} (ms) | decode step (ms) | greedy tokens = transformers |",
             "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        size = f"{r['bytes'] / 2**20:.1f}" if "bytes" in r else "-"
        if "tokens" in r:
            match = sum(a == b for a, b in zip(r["tokens"], truth))
            lines.append(f"| {name} | {r['export_s']:.1f} | {size} | {1e3 * r['prefill']:.1f} | "
                         f"{1e3 * r['decode']:.2f} | {match}/{len(truth)} |")
        else:
            lines.append(f"| {name} | {r['export_s']:.1f} | {size} | - | - | {r['error']} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
