"""Long prompts on one GPU in one device call of <= 9 minutes (issue 45): attention prefill kernels
against a long cache, the GPU tests of gdn::attention_at, the prefill chunk, and `gdn-export bench`
end to end from 32K to 262K tokens beside transformers + flash-linear-attention; a short table last.

    python3 benchmarks/long_context.py [--out DIR] [--parts kernels,tests,chunks,e2e] [--budget 520]

Parts (in order, each while the budget lasts):
  kernels  one chunk of S new tokens (B 1, the 1.66B model's H 16 / Hkv 2 / D 256; and D 128 with
           Hkv 4) against past P written slots (P 0 .. 258K): the routes of gdn::attention_at
           (PyTorch's FlashAttention-2 varlen, the positional Triton kernel in each CONFIGS
           candidate), the mask route it replaced (visibility mask + kernels.attention.triton.prefill)
           and cuDNN SDPA (square causal, K / V repeated over the group), each checked against an fp32
           reference first; median ms of 10 CUDA-event timings, TFLOPS of causal attention (4 S (P +
           S / 2) H D flops)
  tests    pytest -m gpu tests/ops/attention/test_positions.py (every route against the float64
           oracle, poisoned unread slots)
  chunks   `gdn-export bench` of a 65,536-token prompt in chunks of 4K .. 64K tokens and the default
  e2e      `gdn-export bench` (bf16, triton ops, CUDA graphs, batch 1, 16 decode steps) at 32K, 64K,
           128K (beside transformers + FLA: --compare-hf) and 262K, 524K tokens; prefill ms,
           decode ms / step, peak memory
Environment: PROMPTS (e.g. 4096,262144: the e2e prompts, without --compare-hf; a prompt above 524,288
tokens runs once without a warm-up, so put a short one first: PROMPTS=4096,1048576), BENCH_FLAGS (more
flags for every `gdn-export bench` run, e.g. --compile), SHAPES=quick (fewer kernel shapes), CK.
The checkpoint: benchmarks/make_random_checkpoint.py --size 1.6b (max_position_embeddings raised to
1M). flash-linear-attention for transformers' GDN layers: wheels in .carry/fla (installed into
/tmp/site when `import fla` fails). Records (logs, JSON) land in OUT (default $OUT, else a temp
folder); table.md is printed last. docs/perf/long_context.md keeps the table and this command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.records import out_dir  # noqa: E402

START = time.time()


def left(budget: float) -> float:
    return budget - (time.time() - START)


def say(msg: str) -> None:
    print(f"[long_context {time.time() - START:5.0f}s] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------- kernels

def _time(fn, repeats: int = 10) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _rel(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30))


def kernels(out: Path, budget: float) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from gdn_export.ops.attention import _attention_cuda, flash
    from gdn_export.ops.attention.positions import visibility
    from kernels.attention.triton import prefill_positions as PP

    rows = []
    dev = torch.device("cuda")
    shapes = [(16, 2, 256, 4096, P) for P in (0, 28672, 61440, 126976, 258048)]
    shapes += [(16, 4, 128, 4096, P) for P in (0, 61440)]
    shapes += [(16, 2, 256, 16384, 49152)]
    if os.environ.get("SHAPES") == "quick":
        shapes = [(16, 2, 256, 4096, 0), (16, 2, 256, 4096, 61440), (16, 4, 128, 4096, 61440)]
    for H, Hkv, D, S, P in shapes:
        if left(budget) < 60:
            break
        L = P + S
        torch.manual_seed(0)
        q = torch.randn(1, S, H, D, device=dev, dtype=torch.bfloat16).transpose(1, 2)  # the model's view
        key = torch.randn(1, Hkv, L, D, device=dev, dtype=torch.bfloat16)
        value = torch.randn(1, Hkv, L, D, device=dev, dtype=torch.bfloat16)
        past = torch.full((1,), P, dtype=torch.int64, device=dev)
        scale = D ** -0.5
        flops = 4 * S * (P + S / 2) * H * D
        # fp32 reference on the last 256 queries (all of them see the whole cache up to themselves)
        tail = 256
        qt = q[:, :, -tail:].float()
        kk = key.float().repeat_interleave(H // Hkv, 1)
        vv = value.float().repeat_interleave(H // Hkv, 1)
        m = visibility(past, S, L)[:, :, -tail:]
        ref = F.scaled_dot_product_attention(qt, kk, vv, attn_mask=m, scale=scale)
        del kk, vv
        routes = {}
        if flash.takes(q, key, value, 0):
            routes["flash2-varlen"] = lambda: flash.flash_prefill(q, key, value, past, scale)

        def with_config(cfg):
            def run():
                old = dict(PP.CONFIGS)
                PP.CONFIGS.update({k: cfg for k in PP.CONFIGS})
                try:
                    return PP.attention_prefill_positions(q, key, value, past, scale)
                finally:
                    PP.CONFIGS.update(old)
            return run

        configs = [cfg for name, cfg in PP.CONFIGS.items() if name.startswith(f"d{max(16, 1 << (D - 1).bit_length())}")]
        if D == 256:  # the other launches the sm_90 compile report admits
            configs += [c for c in ((128, 32, 8, 2), (64, 64, 4, 2), (64, 32, 4, 2)) if c not in configs]
        for cfg in configs:
            routes[f"triton-positions {cfg}"] = with_config(cfg)
        if S * L <= 2**31:  # the route before builds the [1, 1, S, L] mask each call, as the model did
            routes["mask-triton (before)"] = lambda: _attention_cuda(q, key, value, visibility(past, S, L), scale)
        if P == 0:
            def cudnn():
                from torch.nn.attention import SDPBackend, sdpa_kernel

                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, key.repeat_interleave(H // Hkv, 1),
                                                          value.repeat_interleave(H // Hkv, 1),
                                                          is_causal=True, scale=scale)
            routes["cudnn-sdpa (K/V repeated)"] = cudnn
        for name, fn in routes.items():
            row = dict(H=H, Hkv=Hkv, D=D, S=S, P=P, route=name)
            try:
                o = fn()
                torch.cuda.synchronize()
                row["rel_rms"] = _rel(o[:, :, -tail:], ref)
                row["ms"] = _time(fn)
                row["tflops"] = flops / row["ms"] / 1e9
            except Exception as exc:  # a route that does not run here is reported, not fatal
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
            say(f"kernels {row}")
            rows.append(row)
            torch.cuda.empty_cache()
        del q, key, value, ref
        torch.cuda.empty_cache()
    (out / "kernels.json").write_text(json.dumps(rows, indent=1))
    return rows


# ------------------------------------------------------------------------------------------- bench

def _site(out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    try:
        import fla  # noqa: F401
    except ImportError:
        wheels = sorted(str(p) for p in (ROOT / ".carry" / "fla").glob("*.whl"))
        if wheels:
            r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                "--target", "/tmp/site", *wheels], capture_output=True, text=True)
            (out / "pip.log").write_text(r.stdout + r.stderr)
            if r.returncode == 0:
                env["PYTHONPATH"] = f"{ROOT}:/tmp/site"
    return env


def checkpoint(out: Path, env: dict) -> Path:
    ck = Path(os.environ.get("CK", "/tmp/long_context_ck"))
    if not (ck / "config.json").exists():
        say(f"making the 1.6b checkpoint in {ck}")
        subprocess.run([sys.executable, "benchmarks/make_random_checkpoint.py", str(ck), "--size", "1.6b",
                        "--device", "cuda"], cwd=ROOT, env=env, check=True, capture_output=True)
        config = json.loads((ck / "config.json").read_text())
        config["max_position_embeddings"] = (1 << 20) + 1024  # a 1,048,576-token prompt and its decode steps
        (ck / "config.json").write_text(json.dumps(config, indent=1))
    return ck


def bench(name: str, ck: Path, out: Path, env: dict, limit: float, *flags: str) -> dict | None:
    cmd = [sys.executable, "-m", "gdn_export", "bench", str(ck), "--device", "cuda", "--dtype", "bf16",
           "--op-backend", "triton", "--batch", "1", "--decode-steps", "16", "--json", str(out / f"{name}.json"),
           "--overwrite", *flags, *os.environ.get("BENCH_FLAGS", "").split()]
    say(f"{name}: {' '.join(cmd[3:])} (limit {limit:.0f} s)")
    with open(out / f"{name}.log", "w") as log:
        try:
            r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=limit)
        except subprocess.TimeoutExpired:
            say(f"{name}: cut at {limit:.0f} s")
            return None
    if r.returncode:
        say(f"{name}: exit {r.returncode} ({(out / f'{name}.log').read_text().strip().splitlines()[-1:]})")
        return None
    return json.loads((out / f"{name}.json").read_text())


def _ours(res: dict) -> dict:
    return res.get("ours", res)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--parts", default="kernels,tests,chunks,e2e")
    p.add_argument("--budget", type=float, default=520)
    args = p.parse_args()
    out = out_dir(args.out, "long_context")
    parts = args.parts.split(",")
    table = [f"# long context ({time.strftime('%Y-%m-%d')})"]
    try:
        import torch

        table.append(f"{torch.cuda.get_device_name()} · torch {torch.__version__}")
    except Exception:
        pass
    env = _site(out)
    if "kernels" in parts:
        rows = kernels(out, args.budget)
        table += ["", "| H/Hkv/D | S | past | route | ms | TFLOPS | rel RMS |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            table.append(f"| {r['H']}/{r['Hkv']}/{r['D']} | {r['S']} | {r['P']} | {r['route']} | "
                         f"{r.get('ms', float('nan')):.2f} | {r.get('tflops', float('nan')):.0f} | "
                         f"{r.get('rel_rms', float('nan')):.1e} {r.get('error', '')} |")
    if "tests" in parts and left(args.budget) > 120:
        say("tests")
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                            "tests/ops/attention/test_positions.py", "-x"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=max(30, min(150, left(args.budget) - 60)))
        (out / "tests.log").write_text(r.stdout + r.stderr)
        table += ["", f"tests: {(r.stdout.strip().splitlines() or ['?'])[-1]}"]
    results = {}
    if ("chunks" in parts or "e2e" in parts) and left(args.budget) > 90:
        ck = checkpoint(out, env)
        if "e2e" in parts:
            runs = ((32768, True), (65536, True), (262144, False), (131072, True), (524288, False))
            if os.environ.get("PROMPTS"):
                runs = tuple((int(n), False) for n in os.environ["PROMPTS"].split(","))
            for n, hf in runs:
                if left(args.budget) < 60:
                    break
                # Above 524,288 tokens the warm-up would double a call of minutes: no warm-up, the
                # kernels compiled by an earlier prompt of the call (Triton's disk cache).
                flags = ["--prompt-len", str(n), "--warmup", "1" if n <= 524288 else "0",
                         "--repeats", "2" if n <= 65536 else "1"]
                results[f"e2e-{n}"] = bench(f"e2e-{n}", ck, out, env, left(args.budget) - 20,
                                            *flags, *(["--compare-hf"] if hf else []))
        if "chunks" in parts:
            for c in (16384, 32768, 8192, 65536):
                if left(args.budget) < 45:
                    break
                results[f"chunk-{c}"] = bench(f"chunk-{c}", ck, out, env, left(args.budget) - 15,
                                              "--prompt-len", "65536", "--prefill-chunk", str(c), "--warmup", "1",
                                              "--repeats", "2")
        table += ["", "| run | prompt | chunk | prefill ms | decode ms/step | peak GB | transformers+FLA prefill ms | "
                  "theirs peak GB | ours / theirs |", "|---|---|---|---|---|---|---|---|---|"]
        for name, res in results.items():
            if not res:
                table.append(f"| {name} | | | failed / cut | | | | | |")
                continue
            o = _ours(res)
            hf = res.get("transformers") or res.get("hf") or {}
            ratio = (o["prefill_ms"] / hf["prefill_ms"]) if hf.get("prefill_ms") else float("nan")
            table.append(f"| {name} | {res.get('prompt_len', o.get('prompt_len', ''))} | {o.get('prefill_chunk')} | "
                         f"{o['prefill_ms']:.0f} | {o.get('decode_ms_per_step', float('nan')):.2f} | "
                         f"{o.get('peak_memory_bytes', 0) / 1e9:.1f} | {hf.get('prefill_ms', float('nan')):.0f} | "
                         f"{hf.get('peak_memory_bytes', 0) / 1e9:.1f} | {ratio:.2f} |")
    text = "\n".join(table) + "\n"
    (out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
