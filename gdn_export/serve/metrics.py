"""The server's Prometheus metrics (prometheus_client), served at /metrics.

    gdn_serve_queue_length                  gauge      requests waiting for a row
    gdn_serve_running_sequences{phase}      gauge      sequences in prefill / decode rows
    gdn_serve_reserved_tokens               gauge      prompt + max_tokens reserved by running sequences
    gdn_serve_generation_tokens_per_second  gauge      generated tokens per second over the last 10 s
    gdn_serve_prompt_tokens_total           counter    prompt tokens prefilled
    gdn_serve_generation_tokens_total       counter    tokens generated (rate() of it: tokens/s)
    gdn_serve_requests_total{finish_reason} counter    finished requests: stop, length, cancelled, error
    gdn_serve_rejected_requests_total{status} counter  requests refused before the engine (400, 429, 503 ...)
    gdn_serve_time_to_first_token_seconds   histogram  arrival to first token
    gdn_serve_inter_token_latency_seconds   histogram  between consecutive tokens of a request
    gdn_serve_request_latency_seconds       histogram  arrival to last token
    gdn_serve_step_seconds{kind}            histogram  a prefill call; a decode step from launch to tokens on the host
    gdn_serve_spec_draft_tokens_total       counter    drafts verified (serve --speculative: K a row a round)
    gdn_serve_spec_accepted_tokens_total    counter    drafts accepted (their ratio: the acceptance rate)

Each server has its own registry (several can live in one process, as in the tests). The engine
calls the on_* methods from its thread; prometheus_client's metrics are thread-safe.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
                   1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
WINDOW_S = 10.0


class ServeMetrics:
    """The metrics of one server (module docstring). `bind(stats)` attaches the gauges to a
    function returning the engine's counts {"waiting", "prefill", "decode", "reserved_tokens"}."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue = Gauge("gdn_serve_queue_length", "Requests waiting for a row", registry=r)
        self.running = Gauge("gdn_serve_running_sequences", "Sequences in prefill or decode rows",
                             ["phase"], registry=r)
        self.reserved = Gauge("gdn_serve_reserved_tokens", "Prompt + max_tokens reserved by running sequences",
                              registry=r)
        self.rate = Gauge("gdn_serve_generation_tokens_per_second",
                          f"Generated tokens per second over the last {WINDOW_S:.0f} s", registry=r)
        self.prompt_tokens = Counter("gdn_serve_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.generation_tokens = Counter("gdn_serve_generation_tokens", "Tokens generated", registry=r)
        self.requests = Counter("gdn_serve_requests", "Finished requests", ["finish_reason"], registry=r)
        self.rejected = Counter("gdn_serve_rejected_requests", "Requests refused before the engine",
                                ["status"], registry=r)
        self.ttft = Histogram("gdn_serve_time_to_first_token_seconds", "Arrival to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("gdn_serve_inter_token_latency_seconds", "Between consecutive tokens",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("gdn_serve_request_latency_seconds", "Arrival to last token",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.step = Histogram("gdn_serve_step_seconds", "One engine model call", ["kind"],
                              buckets=LATENCY_BUCKETS, registry=r)
        self.drafts = Counter("gdn_serve_spec_draft_tokens", "Speculative drafts verified", registry=r)
        self.accepted = Counter("gdn_serve_spec_accepted_tokens", "Speculative drafts accepted", registry=r)
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._recent_lock = threading.Lock()
        self.rate.set_function(self._tokens_per_second)

    def bind(self, stats: Callable[[], dict]) -> None:
        self.queue.set_function(lambda: stats()["waiting"])
        self.running.labels("prefill").set_function(lambda: stats()["prefill"])
        self.running.labels("decode").set_function(lambda: stats()["decode"])
        self.reserved.set_function(lambda: stats()["reserved_tokens"])

    # ------------------------------------------------------------------ from the engine thread
    def on_step(self, kind: str, seconds: float, tokens: int) -> None:
        """One model call: kind "prefill" (tokens: prompt tokens it took) or "decode" (tokens: rows)."""
        self.step.labels(kind).observe(seconds)
        if kind == "prefill":
            self.prompt_tokens.inc(tokens)

    def on_tokens(self, count: int, now: float) -> None:
        self.generation_tokens.inc(count)
        with self._recent_lock:
            self._recent.append((now, count))
            self._trim(now)

    def on_round(self, drafted: int, accepted: int) -> None:
        """A speculative round: drafts verified over its rows, and how many of them were kept."""
        self.drafts.inc(drafted)
        self.accepted.inc(accepted)

    def on_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def on_next_token(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def on_finish(self, reason: str, seconds: float | None) -> None:
        self.requests.labels(reason).inc()
        if seconds is not None:
            self.latency.observe(seconds)

    # ------------------------------------------------------------------ from the app
    def on_rejected(self, status: int) -> None:
        self.rejected.labels(str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _trim(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - WINDOW_S:
            self._recent.popleft()

    def _tokens_per_second(self) -> float:
        now = time.perf_counter()
        with self._recent_lock:
            self._trim(now)
            return sum(c for _, c in self._recent) / WINDOW_S
