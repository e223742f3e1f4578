"""What serve_bench.py and serve_soak.py share: starting `gdn-export serve` as a child process, and a
lean asyncio HTTP/1.1 client for its streams (no third-party client in the measured path: one Python
process drives up to 128 streams of hundreds of events a second, where a full client's per-chunk
parsing would be what is measured).

    server = start_server(checkpoint, [flags...])  -> Server(url, proc, log lines)
    result = await stream_completion(url, body)      -> Stream(status, events, error)
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log: list[str]

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (the drain), then the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def start_server(checkpoint: str | Path, flags: list[str], timeout: float = 600.0, env: dict | None = None) -> Server:
    """`python -m gdn_export serve CHECKPOINT --port 0 FLAGS` until it says where it serves."""
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, "-m", "gdn_export", "serve", str(checkpoint), "--port", "0",
                             "--no-access-log", *flags], stderr=subprocess.PIPE, text=True, env=env)
    log: list[str] = []
    deadline = time.monotonic() + timeout
    for line in proc.stderr:
        log.append(line)
        print(f"  server: {line.rstrip()}", file=sys.stderr, flush=True)
        found = re.search(r"at (http://\S+):(\d+)/v1 ", line)
        if found:
            threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
            return Server(f"{found.group(1)}:{found.group(2)}", proc, log)
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError("gdn-export serve did not start:\n" + "".join(log[-20:]))


@dataclass
class Stream:
    """One streamed request: status, (arrival time, parsed chunk) per event, the error body if any."""

    sent: float
    status: int = 0
    events: list[tuple[float, dict]] = field(default_factory=list)
    error: dict | None = None
    done: bool = False

    def token_times(self) -> list[tuple[float, int]]:
        """(arrival time, tokens in it) per chunk that carried tokens (return_token_ids)."""
        out = []
        for t, ev in self.events:
            n = sum(len(c.get("token_ids") or []) for c in ev.get("choices") or [])
            if n:
                out.append((t, n))
        return out


async def stream_completion(url: str, body: dict, path: str = "/v1/completions", disconnect_after: int | None = None,
                            timeout: float = 600.0) -> Stream:
    """POST `body` (with "stream": true) and read its events until [DONE]; with disconnect_after,
    close the connection after that many events (a client going away)."""
    parts = urlsplit(url)
    out = Stream(time.perf_counter())
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        data = json.dumps({**body, "stream": True}).encode()
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), timeout)
        out.status = int(status_line.split()[1])
        chunked = False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower():
                chunked = True
        if out.status != 200:
            body_bytes = await reader.read()
            text = _dechunk(body_bytes) if chunked else body_bytes
            out.error = json.loads(text).get("error") if text.strip() else {"message": f"status {out.status}"}
            return out
        buf = b""
        while True:
            if chunked:
                size = int((await asyncio.wait_for(reader.readline(), timeout)).strip() or b"0", 16)
                if size == 0:
                    break
                piece = await reader.readexactly(size + 2)
                buf += piece[:-2]
            else:
                piece = await asyncio.wait_for(reader.read(65536), timeout)
                if not piece:
                    break
                buf += piece
            now = time.perf_counter()
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                payload = event.decode().removeprefix("data: ")
                if payload == "[DONE]":
                    out.done = True
                    return out
                parsed = json.loads(payload)
                if "error" in parsed:
                    out.error = parsed["error"]
                else:
                    out.events.append((now, parsed))
                if disconnect_after is not None and len(out.events) >= disconnect_after:
                    return out
        return out
    finally:
        writer.close()


def _dechunk(raw: bytes) -> bytes:
    out, rest = b"", raw
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.strip() or b"0", 16)
        if size == 0:
            break
        out, rest = out + rest[:size], rest[size + 2:]
    return out


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` (/proc/PID/status VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
