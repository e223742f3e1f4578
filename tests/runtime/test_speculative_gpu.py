"""Speculative decoding on a GPU (gdn_export.runtime.speculative): the GraphRunner's path, each round
one CUDA graph, against plain greedy decoding on the same runner, with the triton and cuda op
backends (each verifies with its every-step kernel: the Triton fused recurrent kernel's, the CUDA
recurrent kernel's stepStates); sampling (eager rounds) runs and is seeded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_export.layout import DeployLayout
from gdn_export.runtime.base import generate
from gdn_export.runtime.cuda_graph import GraphRunner
from gdn_export.runtime.speculative import SpeculativeDecoder
from gdn_export.weights import load_checkpoint
from gdn_export.weights.mtp import load_mtp
from tests.conftest import GPU_ONLY
from tests.mtp_checkpoints import mtp_checkpoint

pytestmark = GPU_ONLY

PROMPTS = [np.array([3, 1, 4, 1, 5, 9, 2]), np.array([6, 5]), np.array([3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4])]


def _decoder(path, dtype, op_backend, k, **kw):
    model = load_checkpoint(path, dtype=dtype, device="cuda")
    model.layout = DeployLayout.make(cache_len=64)
    runner = GraphRunner(model, device="cuda", op_backend=op_backend)
    return runner, SpeculativeDecoder(runner, load_mtp(path, model), k, **kw)


@pytest.mark.parametrize("op_backend", ["triton", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_graph_rounds_give_plain_greedy_tokens(tmp_path_factory, family, dtype, op_backend):
    path = mtp_checkpoint(family, tmp_path_factory.getbasetemp())
    runner, decoder = _decoder(path, dtype, op_backend, 3)
    assert decoder.cuda_graph
    want = generate(runner, PROMPTS, 12).generated
    for _ in range(2):  # the second generation replays the captured round
        np.testing.assert_array_equal(decoder.generate(PROMPTS, 12).generated, want)


@pytest.mark.parametrize("op_backend", ["triton", "cuda"])
@pytest.mark.parametrize("k", [1, 3])
def test_graph_runner_rolls_back_every_acceptance_length(tmp_path_factory, k, op_backend):
    """The GraphRunner's verify and roll-back (fused projections, the GPU kernels' every-step states)
    at every acceptance length, rows accepting different lengths in the same round: a stub draft
    that knows plain greedy's tokens drafts exactly a correct ones (a = 0 .. K, cycling over rows and
    rounds; eager rounds, a stub has no graph), fp32."""
    from tests.runtime.test_speculative import PatternDraft

    path = mtp_checkpoint("qwen3_5", tmp_path_factory.getbasetemp())
    model = load_checkpoint(path, dtype=torch.float32, device="cuda")
    model.layout = DeployLayout.make(cache_len=64)
    runner = GraphRunner(model, device="cuda", op_backend=op_backend)
    reference = generate(runner, PROMPTS, 12 + 2 * k).generated
    stub = PatternDraft(reference, k, runner.vocab_size)
    got = SpeculativeDecoder(runner, load_mtp(path, model), k, draft=stub).generate(PROMPTS, 12).generated
    assert stub.lengths == set(range(k + 1))
    np.testing.assert_array_equal(got, reference[:, :12])


def test_sampling_runs_seeded(tmp_path_factory):
    path = mtp_checkpoint("qwen3_5", tmp_path_factory.getbasetemp())
    _, a = _decoder(path, torch.bfloat16, "triton", 2, temperature=0.8, seed=3)
    _, b = _decoder(path, torch.bfloat16, "triton", 2, temperature=0.8, seed=3)
    assert not a.cuda_graph
    np.testing.assert_array_equal(a.generate(PROMPTS, 10).generated, b.generate(PROMPTS, 10).generated)
