"""`gdn-export serve` on the command line: every bad flag, folder or port is one line and exit 2
before the model loads; a real server process serves, drains on SIGTERM and exits 0."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cli.conftest import cli  # noqa: F401  (the fixture)
from tests.serve.http_client import call, events

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def taken_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


BAD = [
    pytest.param(["--max-num-seqs", "0"], "--max-num-seqs must be >= 1, got 0", id="no-rows"),
    pytest.param(["--max-prefill-seqs", "9", "--max-num-seqs", "4"],
                 "--max-prefill-seqs (9) cannot exceed --max-num-seqs (4)", id="prefill-rows"),
    pytest.param(["--port", "70000"], "--port must be in [0, 65535], got 70000", id="port-range"),
    pytest.param(["--drain-timeout", "-1"], "--drain-timeout must be >= 0 seconds, got -1.0", id="drain"),
    pytest.param(["--max-model-len", "5000"], "--max-model-len 5000 exceeds the model's max_position_embeddings (4096)",
                 id="beyond-positions"),
    pytest.param(["--device", "cpu", "--cuda-graph"], "--cuda-graph needs a CUDA --device, got cpu", id="graph-on-cpu"),
    pytest.param(["--device", "tpu"], "--device 'tpu' is not a torch device", id="device"),
    pytest.param(["--speculative", "0"], "--speculative must be in [1, 16], got 0", id="speculative-k"),
    pytest.param(["--speculative", "2"], "config.json declares no multi-token-prediction head", id="no-mtp-head"),
    pytest.param(["--device", "cpu", "--port", "0", "--max-num-seqs", "2000000", "-q"],
                 "2000008 state rows (--max-num-seqs 2000000 + --max-prefill-seqs 8) of 4096 cache slots need",
                 id="state-memory"),
]


@pytest.mark.parametrize("flags,message", BAD)
def test_bad_flags(cli, tiny_ckpt, flags, message):  # noqa: F811
    assert message in cli("serve", tiny_ckpt, *flags).error_line("serve")


def test_bad_folder_and_taken_port(cli, tiny_ckpt, tmp_path, taken_port):  # noqa: F811
    assert "not found" in cli("serve", tmp_path / "nowhere").error_line("serve")
    graph = tmp_path / "model.onnx"
    graph.write_bytes(b"\x08\x07")
    assert "serve takes the checkpoint folder the graph or engine was exported from" in \
        cli("serve", graph).error_line("serve")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((tiny_ckpt / "config.json").read_text())
    (broken / "model.safetensors").write_bytes((tiny_ckpt / "model.safetensors").read_bytes())
    (broken / "tokenizer.json").write_text("{not json")
    assert "cannot load its tokenizer" in cli("serve", broken, "--port", "0").error_line("serve")
    line = cli("serve", tiny_ckpt, "--port", taken_port).error_line("serve")
    assert re.fullmatch(rf"cannot listen on 127\.0\.0\.1:{taken_port}: .*[Aa]ddress already in use", line), line


@pytest.mark.slow
def test_serves_then_drains_on_sigterm_and_exits_0(tiny_ckpt):
    # one torch thread: the tests share the cores (tests/conftest.py), and OpenMP threads that spin
    # against each other on a busy machine make each tiny step many times slower
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "gdn_export", "serve", str(tiny_ckpt), "--port", "0",
                             "--device", "cpu", "--max-num-seqs", "2", "--max-model-len", "256",
                             "--served-model-name", "tiny", "--no-access-log"],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            found = re.search(r"serving 'tiny' at (http://127\.0\.0\.1:\d+)/v1 \(text and token-id prompts", line)
            if found:
                url = found.group(1)
                break
        else:
            pytest.fail("".join(lines))
        drained = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # keep the pipe moving
        drained.start()
        _, _, data = call(url, "/v1/completions", {"model": "tiny", "prompt": "abc", "max_tokens": 4, "temperature": 0})
        assert data["usage"]["completion_tokens"] >= 1
        body = {"model": "tiny", "prompt": [1, 2], "max_tokens": 60, "temperature": 0, "ignore_eos": True,
                "stream": True}
        result = {}
        streaming = threading.Thread(target=lambda: result.update(chunks=events(url, "/v1/completions", body)))
        streaming.start()
        deadline = time.monotonic() + 30
        while 'gdn_serve_running_sequences{phase="decode"} 1.0' not in call(url, "/metrics", method="GET")[2]:
            assert time.monotonic() < deadline, "the streamed request never ran"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, "".join(lines)
        streaming.join(10)
        chunks = result["chunks"]
        assert chunks[-1] == "[DONE]" and chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert "draining" in "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
