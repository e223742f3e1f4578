"""Faults over HTTP: a client that disconnects frees its row; a full queue answers 429 with
Retry-After; a drain (SIGTERM) finishes the running requests, refuses new ones with 503, and ends
the server; past --drain-timeout the running ones get a clean error; an API key is enforced; a
checkpoint without a tokenizer serves token ids and refuses text in one clear 400."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gdn_export.serve.scheduler import Limits
from tests.serve.conftest import LiveServer, Reference, fast_runner, make_tiny
from tests.serve.http_client import call, connect, events

COMPLETIONS = "/v1/completions"


def _slow(runner, seconds: float = 0.01):
    """The runner with every decode step `seconds` longer (a request of N tokens lasts >= N x seconds)."""
    decode = runner.decode_rows
    runner.decode_rows = lambda *a: (time.sleep(seconds), decode(*a))[1]
    return runner


def _until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _metric(server, name: str) -> float:
    for line in server.metrics.render().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split(" ")[1])
    return 0.0


@pytest.fixture
def slow_server(tiny_ckpt):
    server = LiveServer(tiny_ckpt, runner=_slow(fast_runner(tiny_ckpt)), drain_timeout=30)
    yield server
    server.stop()


LONG = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 150, "temperature": 0, "ignore_eos": True}


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
def test_a_client_that_disconnects_frees_its_row(slow_server, stream):
    import json

    conn = connect(slow_server.url)
    conn.request("POST", COMPLETIONS, body=json.dumps({**LONG, "stream": stream}).encode(),
                 headers={"Content-Type": "application/json"})
    engine = slow_server.engine
    _until(lambda: engine.stats()["decode"] == 1)
    if stream:
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data: ")
    conn.sock.shutdown(2)
    conn.close()
    # 150 steps of >= 10 ms would take 1.5 s; the row is free long before
    t0 = time.monotonic()
    _until(lambda: engine.idle, timeout=10)
    assert time.monotonic() - t0 < 1.0
    assert _metric(slow_server, 'gdn_serve_requests_total{finish_reason="cancelled"}') == 1
    status, _, data = call(slow_server.url, COMPLETIONS, {**LONG, "max_tokens": 2})  # the server goes on
    assert status == 200 and data["usage"]["completion_tokens"] == 2


def test_a_full_queue_answers_429_with_retry_after(tiny_ckpt):
    runner = fast_runner(tiny_ckpt)
    server = LiveServer(tiny_ckpt, Limits(max_num_seqs=1, max_prefill_seqs=1, max_queue=1), runner=runner)
    gate = threading.Event()  # set after the server's warm-up, which runs the prefill too
    step = runner.step
    runner.step = lambda *a: (gate.wait(30), step(*a))[1]  # the first prefill waits for the gate
    body = {"model": "tiny", "prompt": [4, 5], "max_tokens": 3, "temperature": 0}
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(call, server.url, COMPLETIONS, body)
            _until(lambda: server.engine.stats()["prefill"] == 1)
            second = pool.submit(call, server.url, COMPLETIONS, body)
            _until(lambda: server.engine.stats()["waiting"] == 1)
            status, headers, data = call(server.url, COMPLETIONS, body)
            assert status == 429 and 1 <= int(headers["retry-after"]) <= 60
            assert data["error"]["type"] == "rate_limit_error" and data["error"]["code"] == "queue_full"
            assert "the queue is full (1 requests waiting, --max-queue)" in data["error"]["message"]
            gate.set()
            assert first.result()[0] == second.result()[0] == 200
            assert first.result()[2]["choices"][0]["text"] == second.result()[2]["choices"][0]["text"]
    finally:
        gate.set()
        server.stop()


def test_drain_finishes_what_runs_and_refuses_the_rest(slow_server):
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(events, slow_server.url, COMPLETIONS, {**LONG, "max_tokens": 60, "stream": True})
        _until(lambda: slow_server.engine.stats()["decode"] == 1)
        slow_server.server.handle_exit(signal.SIGTERM, None)
        status, _, data = call(slow_server.url, COMPLETIONS, LONG)
        assert status == 503 and data["error"]["code"] == "draining" and "shutting down" in data["error"]["message"]
        assert call(slow_server.url, "/health", method="GET")[:3:2] == (503, {"status": "draining"})
        chunks = running.result()
    assert chunks[-1] == "[DONE]" and chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert sum(1 for c in chunks[:-1] if c["choices"][0]["text"] is not None) >= 1
    slow_server.thread.join(15)
    assert not slow_server.thread.is_alive(), "the server did not exit after the drain"


def test_past_the_drain_timeout_running_requests_get_an_error(tiny_ckpt):
    server = LiveServer(tiny_ckpt, runner=_slow(fast_runner(tiny_ckpt)), drain_timeout=0.2)
    try:
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(events, server.url, COMPLETIONS, {**LONG, "stream": True})
            _until(lambda: server.engine.stats()["decode"] == 1)
            server.server.handle_exit(signal.SIGTERM, None)
            chunks = running.result()
        assert chunks[-1] == "[DONE]"
        error = chunks[-2]["error"]
        assert error["type"] == "service_unavailable" and "--drain-timeout 0.2 s" in error["message"]
        server.thread.join(15)
        assert not server.thread.is_alive()
    finally:
        server.stop()


def test_api_key_and_a_checkpoint_without_tokenizer(tmp_path):
    ckpt = make_tiny(tmp_path / "ids-only", tokenizer=False)
    server = LiveServer(ckpt, api_key="sesame")
    key = {"Authorization": "Bearer sesame"}
    body = {"model": "tiny", "prompt": [9, 8, 7], "max_tokens": 5, "temperature": 0}
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            status, _, data = call(server.url, COMPLETIONS, body, headers=headers)
            assert status == 401 and data["error"]["type"] == "authentication_error"
        assert call(server.url, "/health", method="GET")[0] == 200  # health and metrics stay open
        status, _, data = call(server.url, COMPLETIONS, body, headers=key)
        choice = data["choices"][0]
        assert status == 200 and choice["text"] == "" and choice["token_ids"] == Reference(ckpt)([9, 8, 7], 5)
        assert choice["prompt_token_ids"] == [9, 8, 7]
        status, _, data = call(server.url, COMPLETIONS, {**body, "prompt": "words"}, headers=key)
        assert status == 400 and "this checkpoint has no tokenizer" in data["error"]["message"]
        assert "give the prompt as token ids" in data["error"]["message"]
        status, _, data = call(server.url, "/v1/chat/completions",
                               {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}, headers=key)
        assert status == 400 and "chat needs one" in data["error"]["message"]
    finally:
        server.stop()
