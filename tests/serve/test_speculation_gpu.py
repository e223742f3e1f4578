"""Speculative serving on a GPU: the engine's rounds replayed from the CUDA graphs `Speculation.bind`
captures (one per power-of-two batch size), every greedy request's tokens those of its prompt decoded
alone on the same runner, with requests joining and leaving (rounds of 1 .. 4 rows, padded sizes);
a sampling request among them switches those rounds to eager ones and the greedy ones stay exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_export.layout import DeployLayout
from gdn_export.runtime.base import generate
from gdn_export.runtime.cuda_graph import GraphRunner
from gdn_export.serve.sampling import SamplingParams
from gdn_export.serve.scheduler import Limits
from gdn_export.serve.speculation import Speculation
from gdn_export.weights import load_checkpoint
from gdn_export.weights.mtp import load_mtp
from tests.conftest import GPU_ONLY
from tests.mtp_checkpoints import mtp_checkpoint
from tests.serve.conftest import start_engine

pytestmark = GPU_ONLY

LENGTHS = (3, 17, 1, 40, 9, 26)
MAX_TOKENS = (12, 5, 9, 14, 3, 10)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "with-a-sampling-request"])
def test_graph_rounds_serve_plain_greedy_tokens(tmp_path_factory, family, sampling):
    path = mtp_checkpoint(family, tmp_path_factory.getbasetemp())
    model = load_checkpoint(path, dtype=torch.float32, device="cuda")
    model.layout = DeployLayout.make(cache_len=96)
    runner = GraphRunner(model, device="cuda", op_backend="triton")
    prompts = [np.random.default_rng(4).integers(0, runner.vocab_size, n) for n in LENGTHS]
    want = [generate(runner, [p], m).generated[0].tolist() for p, m in zip(prompts, MAX_TOKENS)]
    spec = Speculation(runner, load_mtp(path, model), 3)
    assert spec.cuda_graph
    params = [SamplingParams(max_tokens=m) for m in MAX_TOKENS]
    if sampling:
        params[1] = SamplingParams(max_tokens=MAX_TOKENS[1], temperature=0.8, seed=3)
    engine, got = start_engine(runner, Limits(max_num_seqs=4, max_prefill_seqs=2, prefill_tokens=32),
                               speculation=spec)
    try:
        for i, p in enumerate(prompts):
            engine.submit(p, params[i], i)
        got.wait(range(len(prompts)))
    finally:
        engine.stop()
    assert sorted(s for s in spec._sessions) == [1, 2, 4]
    assert all(s.graph is not None for s in spec._sessions.values())
    for i in range(len(prompts)):
        if params[i].greedy:
            assert got.tokens(i) == want[i], i
        else:
            assert len(got.tokens(i)) == MAX_TOKENS[i]
