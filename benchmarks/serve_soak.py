"""A soak of `gdn-export serve`: mixed traffic for N minutes, the server's memory sampled throughout.

    python benchmarks/serve_soak.py --minutes 10 --out OUT            (CPU: a make-tiny model + test tokenizer)
    python benchmarks/serve_soak.py --checkpoint DIR --device cuda --minutes 10 --out OUT

--clients clients loop over random requests: completions of text or token ids, chats, streamed or not,
1..48 new tokens, greedy (each such request's text must equal the first answer to the same request)
or seeded sampling (likewise), stop strings; one in ten streams is dropped after a few events (the
client goes away), one in twenty requests is malformed (it must get a 400). Every 5 s the server's
resident memory and its /metrics gauges are sampled. PASS when no request was lost or answered
wrongly, the server drained and exited 0 on SIGTERM, and its memory is flat: the mean of the last
fifth of the samples exceeds the mean of the second fifth (after the warm-up) by less than
max(5 %, 32 MiB). Writes OUT/soak.json and prints the verdict last; exit status 0 on PASS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_client import ROOT, rss_bytes, start_server, stream_completion  # noqa: E402

WORDS = "the a of to in is it you that he was for on are with as his they be at one have this from".split()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", help="checkpoint folder with a tokenizer (default: make-tiny + the test tokenizer)")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--device", default="cpu")
    p.add_argument("--serve-flags", default="", help="more flags for gdn-export serve")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = Path(args.checkpoint) if args.checkpoint else _tiny(out)
    env = {"OMP_NUM_THREADS": "1"} if args.device == "cpu" else {}
    server = start_server(ckpt, ["--device", args.device, "--max-num-seqs", "8", "--max-model-len", "256",
                                 "--max-queue", str(4 * args.clients), "--log-level", "warning",
                                 *args.serve_flags.split()], env=env)
    with urllib.request.urlopen(f"{server.url}/v1/models") as resp:
        model = json.load(resp)["data"][0]["id"]
    stats = {"ok": 0, "dropped": 0, "bad_as_expected": 0, "rate_limited": 0, "wrong": [], "unexpected": []}
    samples: list[dict] = []
    t_end = time.monotonic() + args.minutes * 60
    try:
        asyncio.run(_soak(server, model, args.clients, t_end, stats, samples))
    finally:
        code = server.stop(timeout=120)
    verdict = _verdict(stats, samples, code)
    (out / "soak.json").write_text(json.dumps({"stats": stats, "samples": samples, "exit": code,
                                               "verdict": verdict}, indent=2))
    (out / "server.log").write_text("".join(server.log))
    print(f"requests: {stats['ok']} answered, {stats['dropped']} dropped by their client, {stats['bad_as_expected']} "
          f"malformed (400), {stats['rate_limited']} rate-limited (429); wrong {len(stats['wrong'])}, "
          f"unexpected errors {len(stats['unexpected'])}; server exit {code}")
    if samples:
        top = max(s["rss"] for s in samples)
        print(f"server RSS MiB: first {samples[0]['rss'] / 2**20:.1f}, max {top / 2**20:.1f}, "
              f"last {samples[-1]['rss'] / 2**20:.1f} ({len(samples)} samples)")
    print(verdict)
    return 0 if verdict.startswith("PASS") else 1


def _tiny(out: Path) -> Path:
    ckpt = out / "ckpt-tiny"
    if not (ckpt / "tokenizer.json").is_file():
        sys.path.insert(0, str(ROOT))
        from gdn_export.cli.main import main as cli
        from tests.serve.tiny_tokenizer import write_tokenizer

        assert cli(["make-tiny", str(ckpt), "--seed", "1", "--overwrite"]) == 0
        write_tokenizer(ckpt)
    return ckpt


async def _soak(server, model: str, clients: int, t_end: float, stats: dict, samples: list) -> None:
    first: dict[str, str] = {}

    async def client(i: int) -> None:
        rng = random.Random(i)
        while time.monotonic() < t_end:
            await _one(server.url, model, rng, first, stats)

    async def sampler() -> None:
        while time.monotonic() < t_end:
            samples.append({"t": time.monotonic(), "rss": rss_bytes(server.proc.pid), **_gauges(server.url)})
            await asyncio.sleep(5)

    await asyncio.gather(sampler(), *(client(i) for i in range(clients)))


async def _one(url: str, model: str, rng: random.Random, first: dict, stats: dict) -> None:
    kind = rng.choice(["text", "ids", "chat"])
    prompt_words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
    body = {"model": model, "max_tokens": rng.randint(1, 48), "return_token_ids": True}
    if rng.random() < 0.5:
        body["temperature"] = 0
    else:
        body.update(temperature=rng.choice([0.7, 1.0]), top_p=rng.choice([1.0, 0.9]), seed=rng.randint(0, 5))
    if rng.random() < 0.2:
        body["stop"] = [rng.choice(["e", "th", "a "])]
    path = "/v1/completions"
    if kind == "chat":
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt_words}]
    else:
        body["prompt"] = prompt_words if kind == "text" else [rng.randrange(3, 256) for _ in range(rng.randint(1, 60))]
    if rng.random() < 0.05:
        body["no_such_field"] = 1
    drop = 2 if rng.random() < 0.1 else None
    stream = rng.random() < 0.7 or drop is not None
    result = await (stream_completion(url, body, path, disconnect_after=drop) if stream else _post(url, path, body))
    if "no_such_field" in body:
        if result["status"] == 400 if isinstance(result, dict) else result.status == 400:
            stats["bad_as_expected"] += 1
        else:
            stats["unexpected"].append(f"malformed request got {result}")
        return
    if not isinstance(result, dict):  # a stream
        if drop is not None:
            stats["dropped"] += 1
            return
        if result.status == 429:
            stats["rate_limited"] += 1
            return
        if result.error or not result.done:
            stats["unexpected"].append(f"stream: status {result.status}, error {result.error}")
            return
        text = "".join((c["choices"][0].get("text") or (c["choices"][0].get("delta") or {}).get("content") or "")
                       for _, c in result.events if c.get("choices"))
    else:
        if result["status"] == 429:
            stats["rate_limited"] += 1
            return
        if result["status"] != 200:
            stats["unexpected"].append(f"status {result['status']}: {result['body']}")
            return
        choice = result["body"]["choices"][0]
        text = choice.get("text") if "text" in choice else choice["message"]["content"]
    key = json.dumps({k: v for k, v in body.items() if k != "stream"}, sort_keys=True)
    if key in first and first[key] != text:
        stats["wrong"].append({"request": key, "first": first[key], "now": text})
    first.setdefault(key, text)
    stats["ok"] += 1


async def _post(url: str, path: str, body: dict) -> dict:
    def call():
        req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as resp:
                return {"status": resp.status, "body": json.load(resp)}
        except urllib.error.HTTPError as exc:
            return {"status": exc.code, "body": exc.read().decode()}

    return await asyncio.to_thread(call)


def _gauges(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/metrics") as resp:
        text = resp.read().decode()
    want = {"gdn_serve_queue_length": "queue", 'gdn_serve_running_sequences{phase="decode"}': "decode",
            "gdn_serve_generation_tokens_total": "tokens"}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in want:
            out[want[name]] = float(value)
    return out


def _verdict(stats: dict, samples: list, code: int) -> str:
    problems = []
    if stats["wrong"]:
        problems.append(f"{len(stats['wrong'])} answers differ from the first answer to the same request")
    if stats["unexpected"]:
        problems.append(f"{len(stats['unexpected'])} unexpected errors (first: {stats['unexpected'][0]})")
    if code != 0:
        problems.append(f"the server exited {code} after SIGTERM")
    if len(samples) >= 10:
        fifth = len(samples) // 5
        early = sum(s["rss"] for s in samples[fifth:2 * fifth]) / fifth
        late = sum(s["rss"] for s in samples[-fifth:]) / fifth
        growth = late - early
        if growth > max(0.05 * early, 32 * 2**20):
            problems.append(f"memory grew {growth / 2**20:.1f} MiB ({early / 2**20:.1f} -> {late / 2**20:.1f} MiB)")
        flat = f"memory flat ({early / 2**20:.1f} -> {late / 2**20:.1f} MiB)"
    else:
        flat = f"too few memory samples ({len(samples)}) to judge"
    if not stats["ok"]:
        problems.append("no request was answered")
    return "FAIL: " + "; ".join(problems) if problems else f"PASS: {stats['ok']} answers, {flat}"


if __name__ == "__main__":
    sys.exit(main())
