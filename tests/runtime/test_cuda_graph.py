"""GraphRunner against TorchRunner: same tokens and logits, static states, device-side greedy decode.

On the CPU the runner runs without CUDA graphs (the static-buffer and greedy-loop logic is the same);
the GPU cases capture the graph and compare with the eager runner on the same weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_export.errors import InputError
from gdn_export.layout import DeployLayout
from gdn_export.runtime.base import generate
from gdn_export.runtime.cuda_graph import GraphRunner
from gdn_export.runtime.torch_runner import TorchRunner
from gdn_export.weights import load_checkpoint
from gdn_export.weights.tiny import make_tiny_checkpoint

DEVICES = [pytest.param("cpu", id="cpu"),
           pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
               not torch.cuda.is_available(), reason="needs a CUDA GPU (none found)")])]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("graph") / "ckpt", family="qwen3_5", seed=5)


def _runners(ckpt, device, cache_len=64, layout=None):
    layout = layout or DeployLayout.make(cache_len=cache_len)
    eager_model, fast_model = (load_checkpoint(ckpt, dtype=torch.float32) for _ in range(2))
    eager_model.layout = fast_model.layout = layout
    return TorchRunner(eager_model, device=device), GraphRunner(fast_model, device=device)


def _ragged_prompts(seed, vocab, lengths):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n) for n in lengths]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lengths", [(9, 9), (13, 1, 6)], ids=["equal", "ragged"])
def test_generate_matches_eager_runner(ckpt, device, lengths):
    eager, fast = _runners(ckpt, device)
    prompts = _ragged_prompts(1, eager.vocab_size, lengths)
    want = generate(eager, prompts, 7)
    got = generate(fast, prompts, 7, prefill_chunk=4)  # chunked prefill on the fast runner
    np.testing.assert_array_equal(got.generated, want.generated)
    for i, (a, b) in enumerate(zip(got.step_logits, want.step_logits)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4, err_msg=f"step {i}")


@pytest.mark.parametrize("device", DEVICES)
def test_states_are_static_buffers_updated_in_place(ckpt, device):
    _, fast = _runners(ckpt, device)
    states = fast.empty_states(2)
    ptrs = [t.data_ptr() for t in states]
    ids = np.ones((2, 5), np.int64)
    _, states = fast.forward(ids, 0, states)
    _, states = fast.forward(ids[:, :1], 5, states)
    assert [t.data_ptr() for t in states] == ptrs
    assert all(float(t.abs().sum()) > 0 for t in states), "every state was written"
    again = fast.empty_states(2)
    assert [t.data_ptr() for t in again] == ptrs
    assert all(float(t.abs().sum()) == 0 for t in again), "empty_states zeroes the buffers"


@pytest.mark.parametrize("device", DEVICES)
def test_decode_greedy_matches_generate(ckpt, device):
    eager, fast = _runners(ckpt, device)
    prompts = _ragged_prompts(2, eager.vocab_size, (11, 4))
    want = generate(eager, prompts, 6)
    from gdn_export.runtime.base import prefill

    logits, states = prefill(fast, prompts, fast.empty_states(2))
    first = logits[:, -1].argmax(-1)[:, None]
    picked, states, kept = fast.decode_greedy(first, [11, 4], states, 5, keep_logits=True)
    np.testing.assert_array_equal(first[:, 0], want.generated[:, 0])
    np.testing.assert_array_equal(picked.cpu().numpy(), want.generated[:, 1:])
    assert len(kept) == 5
    for i, lg in enumerate(kept):
        np.testing.assert_allclose(lg.cpu().numpy(), want.step_logits[i + 1], rtol=0, atol=1e-4)


def test_decode_greedy_checks_the_cache_room(ckpt):
    _, fast = _runners(ckpt, "cpu", cache_len=16)
    states = fast.empty_states(1)
    with pytest.raises(InputError, match="exceed the cache of 16 slots"):
        fast.decode_greedy([[3]], [10], states, 7)
    with pytest.raises(InputError, match=r"tokens must be \[batch, 1\]"):
        fast.decode_greedy([3], [10], states, 2)


def test_default_prefill_chunk_bounds_tokens_per_call(ckpt, monkeypatch):
    """Without a chunk, a batch is prefilled in calls of PREFILL_TOKENS tokens in all (activation
    memory), and the result is the one-call prefill's."""
    import gdn_export.runtime.cuda_graph as cg

    eager, fast = _runners(ckpt, "cpu")
    assert (fast.default_prefill_chunk(1), fast.default_prefill_chunk(32), fast.default_prefill_chunk(8192)) == \
        (4096, 128, 1)
    assert eager.default_prefill_chunk(32) is None  # the other runners: as many as the cache allows
    # with the prompt: equal calls, a multiple of 64 (the GDN chunk), never past the prompt
    assert [fast.default_prefill_chunk(1, n) for n in (100, 4096, 4097, 10000)] == [100, 4096, 2112, 3392]
    assert fast.default_prefill_chunk(32, 200) == 128 and fast.default_prefill_chunk(3, 5) == 5
    monkeypatch.setattr(cg, "PREFILL_TOKENS", 6)  # 3 rows -> calls of 2 tokens
    calls = []
    real = fast._forward
    monkeypatch.setattr(fast, "_forward", lambda ids, *a: calls.append(ids.shape[1]) or real(ids, *a))
    prompts = _ragged_prompts(3, eager.vocab_size, (7, 3, 5))
    want = generate(eager, prompts, 2)
    got = generate(fast, prompts, 2)
    assert max(calls) == 2 and len(calls) >= 4
    np.testing.assert_array_equal(got.generated, want.generated)
    np.testing.assert_allclose(got.step_logits[0], want.step_logits[0], rtol=0, atol=1e-4)


def test_cuda_graph_needs_cuda(ckpt):
    model = load_checkpoint(ckpt)
    with pytest.raises(InputError, match="CUDA graphs need a CUDA device"):
        GraphRunner(model, device="cpu", cuda_graph=True)


def test_compiled_runner_matches_eager_and_writes_caches_in_place(tmp_path, monkeypatch, scalar_cpp_kernels):
    """compile=True (torch.compile before the capture; here on the CPU, inductor's C++ backend):
    the same tokens as the eager runner, with the K/V caches written in place: the functional update
    of export (a copy of every cache per call) is never taken. Custom ops' outputs must have their
    fakes' strides under compile."""
    import gdn_export.modules.gated_attention as gated_attention

    from tests.onnx._tiny import TWO_LAYERS

    ckpt = make_tiny_checkpoint(tmp_path / "ckpt", family="qwen3_5", seed=5, **TWO_LAYERS)
    layout = DeployLayout.make(cache_len=32)
    eager_model, fast_model = (load_checkpoint(ckpt, dtype=torch.float32) for _ in range(2))
    eager_model.layout = fast_model.layout = layout
    eager, fast = TorchRunner(eager_model), GraphRunner(fast_model, device="cpu", compile=True)
    functional = []
    original = gated_attention.kv_cache_update
    monkeypatch.setattr(gated_attention, "kv_cache_update", lambda *a: functional.append(1) or original(*a))
    prompts = _ragged_prompts(3, eager.vocab_size, (7, 7))
    got = generate(fast, prompts, 4)
    want = generate(eager, prompts, 4)
    np.testing.assert_array_equal(got.generated, want.generated)
    assert not functional


def test_default_prefill_chunk_on_a_gpu_follows_the_free_memory(monkeypatch):
    """On a CUDA device the tokens of a call are as many as ACTIVATION_SHARE of the free memory holds
    at activation_bytes_per_token, within [PREFILL_TOKENS, MAX_PREFILL_TOKENS], then split by batch."""
    from types import SimpleNamespace

    import gdn_export.runtime.cuda_graph as cg

    runner = SimpleNamespace(device=torch.device("cuda"), activation_bytes_per_token=lambda: 100_000)
    chunk = lambda batch, free, prompt=None: (  # noqa: E731
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free, 80 * 2**30)),
        cg.GraphRunner.default_prefill_chunk(runner, batch, prompt))[1]
    assert chunk(1, 64 * 10**9) == cg.MAX_PREFILL_TOKENS
    assert chunk(1, 10**9) == cg.PREFILL_TOKENS  # 2500 tokens fit: the floor
    assert chunk(1, int(2.4e9)) == 6000  # between the bounds: what fits
    assert chunk(4, 64 * 10**9) == cg.MAX_PREFILL_TOKENS // 4
    assert chunk(1, 64 * 10**9, 65536) == 8192 and chunk(1, 64 * 10**9, 9000) == 4544
