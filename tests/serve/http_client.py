"""A small HTTP client for the tests (the standard library's http.client): JSON calls and
server-sent-event streams, with control over the raw body and the connection."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit


def connect(url: str, timeout: float = 60.0) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


def call(url: str, path: str, body=None, method: str = "POST", headers: dict | None = None):
    """(status, headers, parsed JSON body) of one request; `body` a dict (sent as JSON) or bytes."""
    conn = connect(url)
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        raw = resp.read()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw.decode()
        return resp.status, dict(resp.getheaders()), parsed
    finally:
        conn.close()


def events(url: str, path: str, body: dict, headers: dict | None = None) -> list:
    """The `data:` payloads of a streamed response, parsed ("[DONE]" as is); asserts status 200."""
    conn = connect(url)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        assert resp.status == 200, (resp.status, resp.read())
        assert resp.getheader("content-type").startswith("text/event-stream")
        out = []
        for line in resp.read().decode().split("\n\n"):
            if line.strip():
                assert line.startswith("data: "), line
                payload = line[len("data: "):]
                out.append(payload if payload == "[DONE]" else json.loads(payload))
        return out
    finally:
        conn.close()


def streamed_text(chunks: list, chat: bool = False) -> str:
    """The text of a stream's chunks (the usage chunk and [DONE] carry none)."""
    text = ""
    for c in chunks:
        if isinstance(c, dict) and c.get("choices"):
            choice = c["choices"][0]
            text += (choice["delta"].get("content") or "") if chat else choice["text"]
    return text
