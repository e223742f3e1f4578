"""`gdn-export serve` under load beside `gdn-export bench`'s static-batch decode, in one run.

    python benchmarks/serve_bench.py --out OUT                  (GPU: the 1.66B Qwen3.5 shape)
    python benchmarks/serve_bench.py --tiny --out OUT           (CPU: a make-tiny model, smaller sizes)

1. The checkpoint: --checkpoint DIR, else a random 1.66B-class Qwen3.5 (benchmarks/make_random_checkpoint.py,
   bf16, made on the GPU; kept in OUT/ckpt-1.6b for the next run), or with --tiny `gdn-export make-tiny`.
2. Static batches: `gdn-export bench CKPT --batch B --prompt-len P --decode-steps G` for each B in
   --concurrency (decode tokens/s of B rows stepped together from a CUDA graph, no host sync).
3. Serving: `gdn-export serve CKPT --max-num-seqs max(B)` in a child process; for each C in
   --concurrency, C clients send at once a streamed completion of a P-token random prompt (token ids)
   with max_tokens G, ignore_eos and temperature 0, after one untimed round. Per request: time to first
   token (TTFT: send to the first token's event) and inter-token latency (ITL: the gap between events over
   the tokens in the later one); over the round: output tokens/s (all tokens / round time) and decode
   tokens/s (tokens that arrived while all C requests were decoding / that window: the steady state the
   static batch measures). Its ratio to the static batch's decode tokens/s at B = C is the "serve / static"
   column (the target: >= 0.85).

Writes OUT/serve_bench.json and OUT/serve_bench.md and prints the table last. Everything runs in one call
(about 5-7 minutes on an H100 from a fresh machine, most of it making and loading the 1.66B checkpoint).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_client import ROOT, start_server, stream_completion  # noqa: E402

sys.path.insert(0, str(ROOT))
# The server's HTTP stack where the machine lacks it (the GPU image): wheels carried in .carry/serve
# (fastapi, starlette, uvicorn, prometheus-client, pydantic and what they need) go to SITE.
WHEELS, SITE = ROOT / ".carry" / "serve", Path("/tmp/serve_site")


def http_stack(say) -> dict:
    """{} when fastapi / uvicorn / prometheus_client import, else installs WHEELS into SITE and returns
    the PYTHONPATH for the server child (SITE also goes on this process's path)."""
    import importlib.util

    if all(importlib.util.find_spec(m) for m in ("fastapi", "uvicorn", "prometheus_client")):
        return {}
    wheels = sorted(str(w) for w in WHEELS.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"serve_bench: fastapi / uvicorn / prometheus-client are not installed and {WHEELS} "
                         f"holds no wheels (pip download them there)")
    say(f"installing the HTTP stack from {len(wheels)} wheels into {SITE}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(SITE),
                    *wheels], check=True)
    sys.path.insert(0, str(SITE))
    return {"PYTHONPATH": str(SITE)}

GPU_DEFAULTS = dict(concurrency=[1, 8, 32, 128], prompt_len=512, gen_len=128)
TINY_DEFAULTS = dict(concurrency=[1, 2, 4], prompt_len=16, gen_len=12)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for the JSON, the table and the logs")
    p.add_argument("--checkpoint", help="checkpoint folder (default: a random 1.66B one in OUT, or --tiny)")
    p.add_argument("--tiny", action="store_true",
                   help="a make-tiny checkpoint on the CPU (a check that the script runs)")
    p.add_argument("--concurrency", type=int, nargs="+", help="client counts = static batch sizes (default "
                   f"{GPU_DEFAULTS['concurrency']}, --tiny {TINY_DEFAULTS['concurrency']})")
    p.add_argument("--prompt-len", type=int, help=f"prompt tokens (default {GPU_DEFAULTS['prompt_len']})")
    p.add_argument("--gen-len", type=int, help=f"tokens generated per request (default {GPU_DEFAULTS['gen_len']})")
    p.add_argument("--device", help="default: cuda (cpu with --tiny)")
    p.add_argument("--dtype", help="default: bf16 (fp32 with --tiny)")
    p.add_argument("--serve-flags", default="", help="more flags for gdn-export serve (e.g. '--compile')")
    args = p.parse_args()
    defaults = TINY_DEFAULTS if args.tiny else GPU_DEFAULTS
    conc = args.concurrency or defaults["concurrency"]
    P, G = args.prompt_len or defaults["prompt_len"], args.gen_len or defaults["gen_len"]
    device = args.device or ("cpu" if args.tiny else "cuda")
    dtype = args.dtype or ("fp32" if args.tiny else "bf16")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def say(msg):
        print(f"[serve_bench {time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    env = http_stack(say)
    if args.tiny:  # this process, its bench runs and the server share a few cores: one torch thread each
        env["OMP_NUM_THREADS"] = os.environ.setdefault("OMP_NUM_THREADS", "1")
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    ckpt = Path(args.checkpoint) if args.checkpoint else _checkpoint(out, args.tiny, say)

    static = {}
    for b in conc:
        say(f"gdn-export bench, batch {b}")
        path = out / f"static_b{b}.json"
        code = _bench_in_process([str(ckpt), "--device", device, "--dtype", dtype, "--batch", str(b),
                                  "--prompt-len", str(P), "--decode-steps", str(G), "--warmup", "1", "--repeats", "3",
                                  "--json", str(path), "--overwrite"], out / f"static_b{b}.log")
        if code != 0:
            say(f"  bench failed ({code}): see {out / f'static_b{b}.log'}")
            continue
        static[b] = json.loads(path.read_text())
        say(f"  {static[b]['decode_tokens_per_s']:.1f} decode tokens/s")
    _free_device(device)

    say("starting gdn-export serve")
    flags = ["--device", device, "--dtype", dtype, "--max-num-seqs", str(max(conc)), "--max-model-len", str(P + G),
             "--max-queue", str(2 * max(conc)), "--log-level", "warning", *args.serve_flags.split()]
    server = start_server(ckpt, flags, env=env)
    rows = []
    try:
        vocab = json.loads((ckpt / "config.json").read_text()).get("vocab_size") or \
            json.loads((ckpt / "config.json").read_text())["text_config"]["vocab_size"]
        for c in conc:
            asyncio.run(_round(server.url, c, P, G, vocab, seed=0))  # untimed: first calls of this batch size
            stats = asyncio.run(_round(server.url, c, P, G, vocab, seed=1))
            st = static.get(c)
            stats["static_decode_tokens_per_s"] = st["decode_tokens_per_s"] if st else None
            stats["ratio"] = stats["decode_tokens_per_s"] / st["decode_tokens_per_s"] if st else None
            rows.append(stats)
            say(f"  {c} clients: decode {stats['decode_tokens_per_s']:.1f} tokens/s, TTFT p50 "
                f"{stats['ttft_p50_ms']:.1f} ms, ITL p50 {stats['itl_p50_ms']:.2f} ms")
    finally:
        code = server.stop()
        (out / "server.log").write_text("".join(server.log))
        say(f"server exited {code}")
    meta = {"checkpoint": str(ckpt), "device": device, "dtype": dtype, "prompt_len": P, "gen_len": G,
            "device_name": _device_name(device), "date": time.strftime("%Y-%m-%d"), "serve_exit": code}
    (out / "serve_bench.json").write_text(json.dumps({**meta, "rows": rows, "static": static}, indent=2))
    table = _table(meta, rows)
    (out / "serve_bench.md").write_text(table + "\n")
    print(table)
    return 0 if code == 0 and len(rows) == len(conc) and all(r["errors"] == 0 for r in rows) else 1


def _bench_in_process(argv: list[str], log: Path) -> int:
    """`gdn-export bench ARGV` in this process (its imports paid once), its output into `log`."""
    import contextlib
    import io

    from gdn_export.cli.main import main as cli

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        code = cli(["bench", *argv])
    log.write_text(buf.getvalue())
    return code


def _free_device(device: str) -> None:
    """Give the bench runs' memory back before the server loads its own model."""
    import gc

    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def _checkpoint(out: Path, tiny: bool, say) -> Path:
    if tiny:
        ckpt = out / "ckpt-tiny"
        if not (ckpt / "config.json").is_file():
            from gdn_export.cli.main import main as cli

            assert cli(["make-tiny", str(ckpt), "--seed", "1"]) == 0
        return ckpt
    ckpt = out / "ckpt-1.6b"
    if not (ckpt / "config.json").is_file():
        say("making the random 1.66B checkpoint")
        subprocess.run([sys.executable, str(ROOT / "benchmarks/make_random_checkpoint.py"), str(ckpt),
                        "--size", "1.6b"], check=True)
    return ckpt


async def _round(url: str, clients: int, P: int, G: int, vocab: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    bodies = [{"model": _model(url), "prompt": rng.integers(0, vocab, P).tolist(), "max_tokens": G, "temperature": 0,
               "ignore_eos": True, "return_token_ids": True} for _ in range(clients)]
    t0 = time.perf_counter()
    streams = await asyncio.gather(*(stream_completion(url, b) for b in bodies))
    wall = time.perf_counter() - t0
    errors = [s.error for s in streams if s.error or not s.done]
    ttft, itl, arrivals = [], [], []
    for s in streams:
        times = s.token_times()
        if not times:
            continue
        ttft.append(times[0][0] - s.sent)
        for (a, _), (b, n) in zip(times, times[1:]):
            itl += [(b - a) / n] * n
        arrivals.append(times)
    total = sum(n for times in arrivals for _, n in times)
    # the window where every request was decoding: after the last first token, before the first last token
    start = max(times[0][0] for times in arrivals)
    end = min(times[-1][0] for times in arrivals)
    in_window = sum(n for times in arrivals for t, n in times if start < t <= end)
    decode = in_window / (end - start) if end > start and in_window else total / wall
    pct = lambda xs, q: float(np.percentile(xs, q)) * 1e3 if xs else float("nan")  # noqa: E731
    return {"clients": clients, "errors": len(errors), "tokens": total, "wall_s": wall,
            "output_tokens_per_s": total / wall, "decode_tokens_per_s": decode,
            "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99), "itl_p50_ms": pct(itl, 50),
            "itl_p99_ms": pct(itl, 99), "itl_mean_ms": statistics.fmean(itl) * 1e3 if itl else float("nan")}


_MODELS: dict[str, str] = {}


def _model(url: str) -> str:
    """The served model's id (GET /v1/models), asked once."""
    if url not in _MODELS:
        import urllib.request

        with urllib.request.urlopen(f"{url}/v1/models") as resp:
            _MODELS[url] = json.load(resp)["data"][0]["id"]
    return _MODELS[url]


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device) if torch.cuda.is_available() else device
    return "cpu"


def _table(meta: dict, rows: list[dict]) -> str:
    f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    lines = [f"gdn-export serve vs bench: {meta['checkpoint']}, {meta['dtype']}, {meta['device_name']}, "
             f"prompt {meta['prompt_len']}, {meta['gen_len']} tokens per request, {meta['date']}", "",
             "| clients | static decode tok/s | serve decode tok/s | serve / static | serve output tok/s | "
             "TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | errors |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['clients']} | {f(r['static_decode_tokens_per_s'], '.1f')} | "
                     f"{r['decode_tokens_per_s']:.1f} | {f(r['ratio'], '.2f')} | {r['output_tokens_per_s']:.1f} | "
                     f"{r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | {r['itl_p50_ms']:.2f} | "
                     f"{r['itl_p99_ms']:.2f} | {r['errors']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
