"""Tiny checkpoints made by `gdn-export make-tiny` (with a byte-level BPE tokenizer where asked), the
engine over them, the same prompts run alone through the eager runner (the reference), and a live
server (uvicorn in a thread, on a free port) for the HTTP tests."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from gdn_export.cli.main import main
from gdn_export.layout import DeployLayout
from gdn_export.runtime.base import generate
from gdn_export.runtime.cuda_graph import GraphRunner
from gdn_export.runtime.torch_runner import TorchRunner
from gdn_export.serve.engine import Engine
from gdn_export.serve.scheduler import Limits
from gdn_export.weights import load_checkpoint
from tests.serve.tiny_tokenizer import write_tokenizer

CACHE_LEN = 160


def make_tiny(folder: Path, family: str = "qwen3_5", tokenizer: bool = True) -> Path:
    """`gdn-export make-tiny FOLDER --family FAMILY`, then the test tokenizer written into it."""
    assert main(["make-tiny", str(folder), "--family", family, "--seed", "7"]) == 0
    if tokenizer:
        write_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Path:
    """A qwen3_5 checkpoint of make-tiny with the test tokenizer."""
    return make_tiny(tmp_path_factory.mktemp("serve") / "tiny-qwen")


def _model(ckpt: Path, cache_len: int, kv_scales=None):
    """The checkpoint's model with an in-place cache of cache_len slots (in FP8 with kv_scales)."""
    from gdn_export.modules.kv_cache_fp8 import set_kv_scales

    model = load_checkpoint(ckpt, dtype=torch.float32)
    model.layout = DeployLayout.make(cache_len=cache_len)
    if kv_scales is not None:
        set_kv_scales(model, kv_scales)
    return model


def fast_runner(ckpt: Path, cache_len: int = CACHE_LEN, kv_scales=None) -> GraphRunner:
    return GraphRunner(_model(ckpt, cache_len, kv_scales), device="cpu")


class Reference:
    """Greedy tokens of one prompt run alone through the eager TorchRunner (what `gdn-export run`
    does), cached per (prompt, max_tokens)."""

    def __init__(self, ckpt: Path, cache_len: int = CACHE_LEN, kv_scales=None):
        self.runner = TorchRunner(_model(ckpt, cache_len, kv_scales))
        self._cache: dict = {}

    def __call__(self, prompt, max_tokens: int) -> list[int]:
        key = (tuple(int(t) for t in prompt), max_tokens)
        if key not in self._cache:
            self._cache[key] = generate(self.runner, [np.asarray(prompt)], max_tokens).generated[0].tolist()
        return self._cache[key]


def until_stop(tokens: list[int], stops) -> list[int]:
    """`tokens` up to and including the first of `stops` (what a generation that stops there keeps)."""
    for i, t in enumerate(tokens):
        if t in stops:
            return tokens[:i + 1]
    return tokens


class Collector:
    """An engine `deliver` that gathers each sink's outputs and signals when every sink is done."""

    def __init__(self):
        self.outputs: dict = {}
        self.finished: dict = {}
        self.cond = threading.Condition()

    def __call__(self, items) -> None:
        with self.cond:
            for sink, out in items:
                self.outputs.setdefault(sink, []).append(out)
                if out.finish_reason is not None or out.error is not None:
                    self.finished[sink] = out
            self.cond.notify_all()

    def tokens(self, sink) -> list[int]:
        return [t for o in self.outputs.get(sink, []) for t in o.token_ids]

    def wait(self, sinks, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(s in self.finished for s in sinks):
                left = deadline - time.monotonic()
                assert left > 0, f"not finished: {[s for s in sinks if s not in self.finished]}"
                self.cond.wait(left)


def start_engine(runner, limits: Limits, eos_ids=(), **kwargs) -> tuple[Engine, Collector]:
    collector = Collector()
    engine = Engine(runner, limits, eos_ids=eos_ids, deliver=collector, **kwargs)
    engine.warm_up()  # as `gdn-export serve` does: the requests below must be exact after it
    engine.start()
    return engine, collector


class LiveServer:
    """create_app over an engine, served by uvicorn (DrainingServer) in a thread on a free port."""

    def __init__(self, ckpt: Path, limits: Limits = Limits(max_num_seqs=8, max_prefill_seqs=4, prefill_tokens=64),
                 cache_len: int = CACHE_LEN, name: str = "tiny", api_key: str | None = None,
                 drain_timeout: float = 30.0, runner=None, speculation=None):
        import uvicorn

        from gdn_export.serve.app import ServeConfig, create_app
        from gdn_export.serve.metrics import ServeMetrics
        from gdn_export.serve.server import GRACE_S, DrainingServer, bind_socket
        from gdn_export.serve.tokenizer import ServeTokenizer, eos_token_ids

        self.tokenizer = ServeTokenizer.load(ckpt)
        self.runner = runner or fast_runner(ckpt, cache_len)
        self.metrics = ServeMetrics()
        self.engine = Engine(self.runner, limits, eos_ids=eos_token_ids(ckpt, self.tokenizer), metrics=self.metrics,
                             speculation=speculation)
        self.engine.warm_up()
        app = create_app(self.engine, self.tokenizer, ServeConfig(model_name=name, checkpoint=str(ckpt),
                                                                  api_key=api_key))
        self.sock = bind_socket("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=GRACE_S)
        self.server = DrainingServer(config, self.engine, drain_timeout)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


@pytest.fixture(scope="module")
def live(tiny_ckpt):
    server = LiveServer(tiny_ckpt)
    yield server
    server.stop()
