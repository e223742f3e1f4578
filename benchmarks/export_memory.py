"""Peak resident memory of `gdn-export export` on a random checkpoint of a few GB.

    python benchmarks/export_memory.py [--gb 2.5] [--family qwen3_5_moe] [--dtype bf16] [--keep DIR]

Writes a random checkpoint of about --gb GB (the tiny layout with large sizes, written one shard at
a time so that the writer never holds the whole checkpoint), then runs `gdn-export export` on it in
a child process and reports the child's peak RSS (ru_maxrss) against the target
1.3 x checkpoint + 1 GB, and the bytes of the ONNX initializers against the checkpoint's tensor
bytes (same dtype; the exporter folds 1-D norm / decay vectors that the model computes in fp32
into fp32 initializers, which may add up to 0.1%). A second child runs the same steps in-process and prints RSS after each phase
(load, trace, save, check), which says what dominates. Logs and a JSON of the results go to $OUT
(or the --keep folder). The results table is printed last.
"""

from __future__ import annotations

from gdn_export.hf_config import parse_config
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _rss_gb() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in GB, from /proc/self/status."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024 / 1e9
    return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)


def _sizes(family: str, gb: float, dtype_bytes: int) -> dict:
    """Config overrides of a model of about `gb` GB: tiny head layout, wide hidden, many layers."""
    hidden, vocab = 2048, 32000
    over = dict(hidden_size=hidden, vocab_size=vocab, num_attention_heads=16, num_key_value_heads=4,
                linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=128,
                linear_value_head_dim=128, max_position_embeddings=4096)
    if family == "olmo_hybrid":
        over.update(intermediate_size=5632)
    elif family in ("qwen3_5_moe", "qwen3_next"):
        over.update(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=512,
                    shared_expert_intermediate_size=1024, head_dim=128)
        if family == "qwen3_next":
            over.update(intermediate_size=5632)
    else:
        over.update(intermediate_size=5632, head_dim=128)
    from gdn_export.config import HybridConfig
    from gdn_export.weights.tiny import tiny_config_dict

    n4, n8 = (_param_count(parse_config(tiny_config_dict(family, num_hidden_layers=n, **over)))
              for n in (4, 8))
    per_layer = (n8 - n4) / 4  # parameters per layer, averaged over the 3:1 GDN:attention pattern
    fixed = n4 - 4 * per_layer
    layers = max(4, round((gb * 1e9 / dtype_bytes - fixed) / per_layer / 4) * 4)
    return dict(over, num_hidden_layers=layers)


def _param_count(cfg) -> int:
    import torch

    from gdn_export.models.hybrid import HybridForCausalLM

    with torch.device("meta"):
        model = HybridForCausalLM(cfg)
    return sum(p.numel() for p in model.parameters())


def write_checkpoint(directory: Path, family: str, gb: float, dtype: str) -> tuple[Path, int]:
    """A random checkpoint in the family's published layout, one ~256 MB shard at a time."""
    import torch
    from safetensors.torch import save_file

    from gdn_export.config import HybridConfig
    from gdn_export.models.hybrid import HybridForCausalLM
    from gdn_export.weights.loader import FAMILIES
    from gdn_export.weights.tiny import tiny_config_dict

    torch_dtype = getattr(torch, DTYPES[dtype])
    over = _sizes(family, gb, torch.empty((), dtype=torch_dtype).element_size())
    cfg_dict = tiny_config_dict(family, dtype=DTYPES[dtype], **over)
    config = parse_config(cfg_dict)
    with torch.device("meta"):
        model = HybridForCausalLM(config)
    naming = FAMILIES[config.family]
    pieces = [(key, tuple(t.shape)) for name, p in model.state_dict().items()
              for key, t in naming.checkpoint_tensors(name, p, config)]
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(cfg_dict, indent=2))
    gen = torch.Generator().manual_seed(0)
    weight_map, shard, size, total, n = {}, {}, 0, 0, 0

    def flush():
        nonlocal shard, size, n
        if shard:
            n += 1
            file = f"model-{n:05d}.safetensors"
            save_file(shard, str(directory / file), metadata={"format": "pt"})
            weight_map.update({k: file for k in shard})
            shard, size = {}, 0

    for key, shape in pieces:
        t = (torch.randn(shape, generator=gen) * 0.02).to(torch_dtype)
        if "norm" in key:
            t = t + 1
        shard[key] = t
        size += t.numel() * t.element_size()
        total += t.numel() * t.element_size()
        if size >= 256 * 2**20:
            flush()
    flush()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory, total


def initializer_bytes(onnx_path: Path) -> int:
    import onnx
    from onnx import helper

    proto = onnx.load(str(onnx_path), load_external_data=False)
    total = 0
    for t in proto.graph.initializer:
        count = 1
        for d in t.dims:
            count *= d
        total += count * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return total


def child_phases(checkpoint: str, output: str, dtype: str) -> None:
    """In-process export printing RSS after each phase (run as a child: its own peak)."""
    import torch

    from gdn_export.onnx import export_onnx
    from gdn_export.weights import load_checkpoint

    t0 = time.time()

    def mark(what):
        rss, peak = _rss_gb()
        print(f"PHASE {time.time() - t0:7.1f}s rss {rss:6.2f} GB peak {peak:6.2f} GB  {what}", flush=True)

    mark("start")
    model = load_checkpoint(checkpoint, dtype=getattr(torch, DTYPES[dtype]))
    mark("loaded")
    export_onnx(model, output, progress=lambda msg: mark(f"before: {msg}"))
    mark("done")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.5, help="checkpoint size to aim for (GB)")
    ap.add_argument("--family", default="qwen3_5_moe")
    ap.add_argument("--dtype", choices=DTYPES, default="bf16", help="checkpoint and export dtype")
    ap.add_argument("--keep", help="folder for the checkpoint and the export (default: a temp folder)")
    ap.add_argument("--no-phases", action="store_true", help="skip the per-phase child")
    ap.add_argument("--child", nargs=3, metavar=("CKPT", "OUT", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child_phases(*args.child)
        return 0

    out_dir = Path(os.environ.get("OUT") or args.keep or tempfile.mkdtemp(prefix="export-memory."))
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="export-memory-work."))
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'kernels'}:{os.environ.get('PYTHONPATH', '')}")
    try:
        ckpt, ckpt_bytes = write_checkpoint(work / "ckpt", args.family, args.gb, args.dtype)
        onnx_path = work / "model.onnx"
        cmd = [sys.executable, "-m", "gdn_export", "export", str(ckpt), "-o", str(onnx_path),
               "--dtype", args.dtype]
        t0 = time.time()
        with open(out_dir / "export.log", "w") as log:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        seconds = time.time() - t0
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux: KiB
        if proc.returncode:
            print((out_dir / "export.log").read_text()[-3000:])
            raise SystemExit(f"export failed with exit code {proc.returncode}")
        init_bytes = initializer_bytes(onnx_path)
        phases = ""
        if not args.no_phases:
            onnx_path.unlink()
            (onnx_path.parent / (onnx_path.name + ".data")).unlink(missing_ok=True)
            res = subprocess.run([sys.executable, __file__, "--child", str(ckpt), str(onnx_path), args.dtype],
                                 capture_output=True, text=True, env=env)
            phases = "\n".join(line for line in res.stdout.splitlines() if line.startswith("PHASE"))
            (out_dir / "phases.log").write_text(res.stdout + res.stderr)
        bound = 1.3 * ckpt_bytes + 1e9
        excess = init_bytes - ckpt_bytes
        result = dict(family=args.family, dtype=args.dtype, checkpoint_bytes=ckpt_bytes,
                      peak_rss_bytes=peak, bound_bytes=bound, initializer_bytes=init_bytes,
                      initializer_excess_bytes=excess, seconds=seconds, peak_within_bound=peak <= bound,
                      initializers_within_checkpoint=excess <= 1e-3 * ckpt_bytes)
        (out_dir / "export_memory.json").write_text(json.dumps(result, indent=2))
        if phases:
            print(phases)
        print("\n| family | dtype | checkpoint | peak RSS | 1.3x + 1 GB | peak / ckpt | ONNX initializers "
              "(- checkpoint) | export time |")
        print("|---|---|---|---|---|---|---|---|")
        print(f"| {args.family} | {args.dtype} | {ckpt_bytes / 1e9:.2f} GB | {peak / 1e9:.2f} GB | "
              f"{bound / 1e9:.2f} GB {'ok' if peak <= bound else 'OVER'} | {peak / ckpt_bytes:.2f} | "
              f"{init_bytes / 1e9:.3f} GB ({excess / 1e3:+.0f} kB) | {seconds:.0f} s |")
        return 0 if result["peak_within_bound"] and result["initializers_within_checkpoint"] else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
