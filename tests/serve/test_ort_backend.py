"""`gdn-export serve --runtime ort`: the exported graph in ONNX Runtime behind the same engine. Every
request's greedy tokens are those of its prompt run alone through the ONNX Runtime runner (what
`gdn-export run model.onnx` does), whatever else shares the batch; the HTTP routes answer as with
the torch runtime; a graph that cannot serve, or does not belong to the checkpoint, is one line and
exit 2 before anything loads or listens."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_export.cli.main import main
from gdn_export.runtime.base import generate
from gdn_export.runtime.ort_runner import OrtRunner
from gdn_export.runtime.ort_serving import OrtStepRunner
from gdn_export.serve.sampling import SamplingParams
from gdn_export.serve.scheduler import Limits
from tests.cli.conftest import cli  # noqa: F401  (the fixture)
from tests.serve.conftest import CACHE_LEN, LiveServer, make_tiny, start_engine
from tests.serve.http_client import call

LENGTHS = (1, 6, 17, 40, 3, 25)
MAX_TOKENS = (5, 9, 2, 7, 11, 6)


def _export(ckpt, path, *flags) -> str:
    assert main(["export", str(ckpt), "-o", str(path), "--max-cache-len", str(CACHE_LEN), "-q", *flags]) == 0
    return str(path)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(checkpoint with the test tokenizer, its fp32 graph) for qwen3_5_moe: GDN, attention and MoE."""
    root = tmp_path_factory.mktemp("ort-serve")
    ckpt = make_tiny(root / "moe", "qwen3_5_moe")
    return ckpt, _export(ckpt, root / "moe.onnx")


def test_every_request_gets_the_tokens_of_its_prompt_alone(exported):
    """Six requests over three decode rows and two prefill rows (prompts longer than a prefill call,
    arrivals while others decode), against OrtRunner's generate of each prompt alone."""
    ckpt, graph = exported
    alone = OrtRunner(graph)
    runner = OrtStepRunner(OrtRunner(graph))
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, runner.vocab_size, n) for n in LENGTHS]
    engine, got = start_engine(runner, Limits(max_num_seqs=3, max_prefill_seqs=2, prefill_tokens=24, max_queue=16))
    try:
        for i, p in enumerate(prompts):
            engine.submit(p, SamplingParams(max_tokens=MAX_TOKENS[i]), i)
        got.wait(range(len(prompts)))
        assert engine.idle and engine.stats()["reserved_tokens"] == 0
    finally:
        engine.stop()
    for i, p in enumerate(prompts):
        want = generate(alone, [p], MAX_TOKENS[i]).generated[0].tolist()
        assert got.tokens(i) == want and got.finished[i].finish_reason == "length", (i, got.tokens(i), want)


def test_steps_write_the_rows_they_are_given(exported):
    """step() on rows 2..3 of a set leaves the other rows untouched and gives the logits of a
    separate call on fresh states; the K/V rows are written in place (no copy of the cache)."""
    _, graph = exported
    runner = OrtStepRunner(OrtRunner(graph))
    import torch

    rows = runner.model.empty_states(5)
    for t in rows:
        t.copy_(torch.rand_like(t, dtype=torch.float32).to(t.dtype))
    before = [t.clone() for t in rows]
    ids = torch.tensor([[3, 4, 5], [6, 7, 0]])
    past, lens = torch.zeros(2, dtype=torch.int64), torch.tensor([3, 2])
    fresh = runner.model.empty_states(2)
    for t in rows:
        t[2:4].zero_()
    logits = runner.step(ids, past, lens, [t[2:4] for t in rows])
    want = runner.step(ids, past, lens, fresh)
    assert torch.equal(logits, want) and logits.shape == (2, 1, runner.vocab_size)
    for t, b, f in zip(rows, before, fresh):
        assert torch.equal(t[:2], b[:2]) and torch.equal(t[4:], b[4:]) and torch.equal(t[2:4], f)


def test_http_completion_over_the_graph(exported):
    ckpt, graph = exported
    server = LiveServer(ckpt, runner=OrtStepRunner(OrtRunner(graph)), name="moe-ort")
    try:
        code, _, body = call(server.url, "/v1/completions",
                             {"model": "moe-ort", "prompt": "the cat", "max_tokens": 5, "temperature": 0})
        assert code == 200 and body["usage"]["completion_tokens"] == 5, body
        code, _, models = call(server.url, "/v1/models", method="GET")
        assert code == 200 and models["data"][0]["id"] == "moe-ort"
    finally:
        server.stop()


def test_bad_graphs_and_flags(cli, exported, tmp_path):  # noqa: F811
    ckpt, graph = exported
    other = make_tiny(tmp_path / "dense", "qwen3_5", tokenizer=False)
    all_logits = _export(other, tmp_path / "all.onnx", "--all-logits")
    cases = [
        (["--runtime", "ort"], "--runtime ort needs --onnx FILE"),
        (["--onnx", graph], "--onnx / --ort-kernels apply to --runtime ort"),
        (["--runtime", "ort", "--onnx", graph, "--dtype", "bf16"], "--dtype applies to --runtime torch only"),
        (["--runtime", "ort", "--onnx", graph, "--max-model-len", "64"], "--max-model-len applies to --runtime torch"),
        (["--runtime", "ort", "--onnx", graph, "--speculative", "2"], "--speculative applies to --runtime torch"),
        (["--runtime", "ort", "--onnx", graph, "--device", "cuda"], "--runtime ort serves on the CPU"),
        (["--runtime", "ort", "--onnx", tmp_path / "none.onnx"], "none.onnx"),
        (["--runtime", "ort", "--onnx", all_logits, "--port", "0"], "was not exported from"),
    ]
    for flags, message in cases:
        assert message in cli("serve", ckpt, *flags).error_line("serve"), flags
    assert "last-position logits" in cli("serve", other, "--runtime", "ort", "--onnx", all_logits,
                                         "--port", "0").error_line("serve")
    import onnx

    from gdn_export.onnx import metadata
    from gdn_export.vlm.detect import KEY_ROLE

    for key, value, message in ((metadata.KEY_SPECULATIVE_ROLE, "verify", "the verify graph of `export --speculative`"),
                                (KEY_ROLE, "language", "the language graph of a vision-language export")):
        proto = onnx.load(graph)
        proto.metadata_props.add(key=key, value=value)
        marked = tmp_path / f"{value}.onnx"
        onnx.save(proto, str(marked))
        assert message in cli("serve", ckpt, "--runtime", "ort", "--onnx", marked).error_line("serve")
