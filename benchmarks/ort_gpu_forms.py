"""The three ONNX forms of the 1.66B Qwen3.5 on ONNX Runtime's CUDA execution provider, beside our own
fast runtime, in one call: decode at batch 1 and 32, prefill of a 4096-token prompt; a table last.

    python benchmarks/ort_gpu_forms.py --out OUT [--checkpoint DIR] [--dtype fp16] [--budget 510]
    python benchmarks/ort_gpu_forms.py --out /tmp/forms --dry-run      # the same steps, tiny, on the CPU

Needs onnxruntime-gpu (its CUDAExecutionProvider; 1.31 has CUDA kernels of the ort form's ops, the
CPU package needs 1.32) in place of onnxruntime, and a GPU. Steps, each timed, each printed:

1. the checkpoint: --checkpoint, or a random 1.66B Qwen3.5 written by
   benchmarks/make_random_checkpoint.py (--size 1.6b) into OUT/q35;
2. the ort form's semantics on the CUDA kernels: a tiny checkpoint exported with --onnx-ops ort and
   `gdn-export validate --ort-device cuda` (ragged rows, decode steps) against PyTorch;
3. one export (gdn form, --dtype, cache of 4096 + 64 slots) and its standard and ort forms,
   rewritten from it (gdn_export.onnx.export.rewrite_form; the three files share one weights file);
4. shape by shape (decode B1 and B32: prompt 128, 32 steps; prefill of 1 x 4096), our own runtime
   `gdn-export bench CHECKPOINT --device cuda` (GraphRunner: triton ops, CUDA-graph decode), then
   `gdn-export bench --runtime ort --device cuda` (OrtRunner: IOBinding, K/V caches updated in
   place, GDN states swapped between two device buffers) on the ort, gdn and standard forms.

A bf16 graph runs on ORT as fp32 rounded to bf16 (gdn_export.onnx.bf16), hence --dtype fp16 by
default: the graph ORT runs in 16-bit. Every bench writes its JSON under OUT; past --budget seconds
the remaining runs are skipped and marked so (the device tool's limit is 600 s a command). The gdn and
standard forms run the same in-memory graph on ORT (both become com.microsoft LinearAttention
blocks); the ort form runs its own GatedDeltaNet / VarlenCausalConvWithState / GatedRMSNorm kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORMS = ("gdn", "standard", "ort")
RUN_MARGIN_S = 45  # no run starts with less of the budget left (a run: a session and its timings)


def _shapes(dry: bool) -> dict[str, dict]:
    """name -> batch, prompt, decode steps and repeats of each timed shape (tiny ones for --dry-run)."""
    decode_batches, prompt, steps, prefill = ((1, 4), 16, 4, 64) if dry else ((1, 32), 128, 32, 4096)
    shapes = {f"decode B{b}": dict(batch=b, prompt=prompt, steps=steps, repeats=1 if dry else 3)
              for b in decode_batches}
    shapes[f"prefill {prefill}"] = dict(batch=1, prompt=prefill, steps=1, repeats=1 if dry else 2)
    return shapes


class Clock:
    """Elapsed time against the budget; `say` prints a timed line."""

    def __init__(self, budget: float):
        self.t0, self.budget = time.perf_counter(), budget

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.budget - self.elapsed()

    def say(self, msg: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {msg}", flush=True)


def _cli(*argv) -> int:
    """gdn-export in this process (imports paid once)."""
    from gdn_export.cli.main import main

    return main([str(a) for a in argv])


def _checkpoint(args, clock: Clock) -> Path:
    if args.checkpoint:
        return Path(args.checkpoint)
    out = Path(args.out) / "q35"
    if (out / "config.json").is_file():
        return out
    if args.dry_run:
        from gdn_export.weights import make_tiny_checkpoint

        return make_tiny_checkpoint(out, "qwen3_5", seed=0, hidden_size=256, num_hidden_layers=4)
    clock.say("writing a random 1.66B Qwen3.5 checkpoint (make_random_checkpoint.py --size 1.6b)")
    subprocess.run([sys.executable, ROOT / "benchmarks/make_random_checkpoint.py", out, "--size", "1.6b",
                    "--device", "cuda"], check=True)
    return out


def _semantics_on_device(args, device: str, clock: Clock) -> str:
    """validate of a tiny ort-form export on the device: "PASS ...", "FAIL ..." or the error."""
    from gdn_export.weights import make_tiny_checkpoint

    work = Path(args.out) / "tiny"
    ckpt = work / "ckpt"
    if not (ckpt / "config.json").is_file():
        make_tiny_checkpoint(ckpt, "qwen3_5", seed=1)
    onnx_path = work / "tiny-ort.onnx"
    if _cli("export", ckpt, "-o", onnx_path, "--onnx-ops", "ort", "--overwrite", "-q") != 0:
        return "export failed"
    report = work / "validate.json"
    code = _cli("validate", ckpt, "--onnx", onnx_path, "--ort-device", device, "--batch", "3",
                "--prompt-len", "70", "--decode-steps", "4", "--json", report, "--overwrite", "-q")
    if not report.is_file():
        return f"validate exited {code}"
    rows = json.loads(report.read_text()).get("rows", [])
    worst = max((r.get("max_abs", 0.0) for r in rows), default=0.0)
    return f"{'PASS' if code == 0 else 'FAIL'} (max abs {worst:.2e} over {len(rows)} rows)"


def _forms(args, ckpt: Path, clock: Clock) -> dict[str, Path]:
    from gdn_export.onnx.export import rewrite_form

    folder = Path(args.out) / "onnx"
    folder.mkdir(parents=True, exist_ok=True)
    gdn = folder / "q35.onnx"
    cache = 4096 + 64 if not args.dry_run else 128
    if not gdn.is_file():
        clock.say(f"exporting {ckpt} ({args.dtype}, cache {cache})")
        if _cli("export", ckpt, "-o", gdn, "--dtype", args.dtype, "--max-cache-len", cache, "-q") != 0:
            raise SystemExit("export failed")
    paths = {"gdn": gdn}
    for form in FORMS[1:]:
        path = folder / f"q35-{form}.onnx"  # beside q35.onnx: its weights file is shared
        if not path.is_file():
            clock.say(f"rewriting to the {form} form")
            tmp = folder / f".q35-{form}.onnx"
            shutil.copyfile(gdn, tmp)
            rewrite_form(tmp, form)
            os.replace(tmp, path)
        paths[form] = path
    return paths


def _bench(argv, json_path: Path) -> dict:
    code = _cli(*argv, "--json", json_path, "--overwrite", "-q")
    if code != 0 or not json_path.is_file():
        return {"error": f"exit {code}"}
    return json.loads(json_path.read_text())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for the checkpoint, the exports and the JSON files")
    p.add_argument("--checkpoint", help="a Qwen3.5 checkpoint (default: a random 1.66B one in OUT/q35)")
    p.add_argument("--dtype", choices=("fp16", "bf16", "fp32"), default="fp16")
    p.add_argument("--budget", type=float, default=510.0, help="seconds after which the remaining runs are skipped")
    p.add_argument("--dry-run", action="store_true", help="tiny checkpoint and shapes on the CPU (checks the script)")
    args = p.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.path.insert(0, str(ROOT))
    clock = Clock(args.budget)
    device = "cpu" if args.dry_run else "cuda"
    if args.dry_run:
        args.dtype = "fp32"  # the CPU runs fp32 (ORT emulates bf16, torch's CPU fp16 is slow)
    import onnxruntime as ort

    from gdn_export.errors import GdnExportError
    from gdn_export.runtime import ort_device

    try:
        ort_device.providers_for(ort_device.parse_device(device))  # onnxruntime-gpu present: one line
    except GdnExportError as exc:
        print(f"ort_gpu_forms: {exc}", file=sys.stderr)
        return 2
    Path(args.out).mkdir(parents=True, exist_ok=True)
    ckpt = _checkpoint(args, clock)
    clock.say(f"the ort form on onnxruntime {ort.__version__} {device} against PyTorch (tiny, ragged)")
    semantics = _semantics_on_device(args, device, clock)
    clock.say(f"ort form on {device}: {semantics}")
    paths = _forms(args, ckpt, clock)
    shapes = _shapes(args.dry_run)
    results: dict[str, dict[str, dict]] = {}
    # Shape by shape, every runtime (standard last: on ORT it runs the gdn form's in-memory graph),
    # so that what the budget leaves out is the end of the list, not a whole runtime.
    runs = [("gdn-export (torch)", ["bench", ckpt, "--device", device, "--dtype", args.dtype])]
    runs += [(f"ORT {form} form", ["bench", "--runtime", "ort", "--onnx", paths[form], "--device", device])
             for form in ("ort", "gdn", "standard")]
    for name, _ in runs:
        results[name] = {}
    for shape, s in shapes.items():
        for name, base in runs:
            key = f"{name} / {shape}"
            if clock.left() < RUN_MARGIN_S:
                results[name][shape] = {"error": "skipped (time)"}
                continue
            clock.say(f"{key}: batch {s['batch']}, prompt {s['prompt']}, {s['steps']} steps")
            slug = "".join(c if c.isalnum() else "_" for c in key)
            results[name][shape] = _bench(
                [*base, "--batch", s["batch"], "--prompt-len", s["prompt"], "--decode-steps", s["steps"],
                 "--warmup", "1", "--repeats", s["repeats"]], Path(args.out) / f"{slug}.json")
    (Path(args.out) / "summary.json").write_text(json.dumps(dict(semantics=semantics, results=results), indent=1))
    print(_table(args, device, ort.__version__, semantics, shapes, results, clock))
    return 0


def _cell(r: dict, shape: str) -> str:
    if "error" in r:
        return r["error"]
    if shape.startswith("prefill"):
        return f"{r['prefill_ms']:.1f} ms ({1e3 * r['batch'] * r['prompt_len'] / r['prefill_ms']:.0f} tok/s)"
    return f"{r['decode_ms_per_step']:.2f} ms ({r['decode_tokens_per_s']:.0f} tok/s)"


def _table(args, device, ort_version, semantics, shapes, results, clock) -> str:
    import torch

    card = torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)"
    lines = [f"{card}, {args.dtype}, onnxruntime {ort_version}, torch {torch.__version__}, "
             f"{time.strftime('%Y-%m-%d')}; ort form vs PyTorch on {device}: {semantics}", "",
             f"| runtime | {' | '.join(shapes)} | kernels |", "|---|" + "---|" * (len(shapes) + 1)]
    for name, row in results.items():
        note = next((r.get("kernels_note", r.get("op_backend", "")) for r in row.values() if "error" not in r), "")
        lines.append(f"| {name} | {' | '.join(_cell(row[s], s) for s in shapes)} | {note} |")
    lines.append(f"\n(decode: ms per step, tokens/s over the batch; prefill: ms for the prompt; "
                 f"{clock.elapsed():.0f} s in all)")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
