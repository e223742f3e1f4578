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


class _ReplayByCalling:
    """A stand-in for a captured CUDA graph on the CPU: replay() calls the captured function."""

    def __init__(self, fn, *args, **kwargs):
        self.fn, self.replays = fn, 0

    def replay(self):
        self.replays += 1
        self.fn()


def _prefill_graph_runners(ckpt, device, monkeypatch, cache_len=64):
    """(eager TorchRunner, GraphRunner with prefill graphs): on the CPU the capture is
    _ReplayByCalling (the runner's bookkeeping, static inputs and copies are what runs); on a GPU
    real CUDA graphs."""
    import gdn_export.runtime.cuda_graph as cg

    eager, fast = _runners(ckpt, device, cache_len)
    if device == "cpu":
        monkeypatch.setattr(cg, "capture_graph", lambda fn, *a, **k: _ReplayByCalling(fn))
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
        fast.prefill_graphs = True
    assert fast.prefill_graphs
    return eager, fast


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_graphs_replay_the_eager_prefill(ckpt, device, monkeypatch):
    """A prefill shape's second call is captured and replayed from then on: the logits (tensors of
    their own, not the pool's) and states equal the eager runner's for every call, chunked and
    whole, across batch sizes; ragged rows stay eager."""
    eager, fast = _prefill_graph_runners(ckpt, device, monkeypatch)
    vocab = eager.vocab_size
    for seed, lengths, chunk in [(1, (9, 9), 4), (2, (9, 9), 4), (3, (8, 8), 4), (4, (5,), None), (5, (5,), None)]:
        prompts = _ragged_prompts(seed, vocab, lengths)
        want = generate(eager, prompts, 3)
        got = generate(fast, prompts, 3, prefill_chunk=chunk)
        np.testing.assert_array_equal(got.generated, want.generated, err_msg=f"seed {seed}")
        for i, (a, b) in enumerate(zip(got.step_logits, want.step_logits)):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-4, err_msg=f"seed {seed} step {i}")
    assert set(fast._prefill) == {(2, 4), (1, 5)}  # (2, 1): the 9-token rows' last call came once
    # device prefill: the same logits call after call, each a tensor of its own
    ids = torch.as_tensor(np.stack(_ragged_prompts(6, vocab, (12, 12)))).to(device)
    first, _ = fast.prefill_device(ids, fast.empty_states(2), 6)
    states_first = [t.clone() for t in fast._static[2].states]
    again, states = fast.prefill_device(ids, fast.empty_states(2), 6)
    assert (2, 6) in fast._prefill
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    for a, b in zip(states, states_first):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    kept = again.clone()
    fast.prefill_device(ids.flip(1), fast.empty_states(2), 6)  # a replay on other tokens
    torch.testing.assert_close(again, kept, rtol=0, atol=0)
    # ragged rows padded to a captured shape (2 x 6, lengths 6 and 4) run eagerly
    graph = fast._prefill[(2, 6)].graph
    replays = getattr(graph, "replays", None)
    ragged = _ragged_prompts(7, vocab, (6, 4))
    for _ in range(2):
        np.testing.assert_array_equal(generate(fast, ragged, 2).generated, generate(eager, ragged, 2).generated)
    assert getattr(graph, "replays", None) == replays


def test_prefill_graphs_keep_the_latest_shapes_and_fall_back_on_a_failed_capture(ckpt, monkeypatch):
    import gdn_export.runtime.cuda_graph as cg
    from gdn_export.errors import GdnExportError

    eager, fast = _prefill_graph_runners(ckpt, "cpu", monkeypatch)
    monkeypatch.setattr(cg, "MAX_PREFILL_GRAPHS", 2)
    vocab = eager.vocab_size
    for n in (3, 4, 5, 3):
        for _ in range(2):
            fast.forward(np.stack(_ragged_prompts(n, vocab, (n,))), 0, fast.empty_states(1))
    assert list(fast._prefill) == [(1, 5), (1, 3)]  # (1, 4) and the first (1, 3) were dropped
    fast.release_prefill_graphs()
    assert not fast._prefill
    # a capture that fails: a warning naming the shape, the prefill runs eagerly and still agrees

    def fail(*a, **k):
        raise GdnExportError("capturing the prefill of 1 x 7 tokens as a CUDA graph failed: boom")

    monkeypatch.setattr(cg, "capture_graph", fail)
    prompt = _ragged_prompts(8, vocab, (7,))
    want = generate(eager, prompt, 2)
    with pytest.warns(RuntimeWarning, match="1 x 7 tokens .* run eagerly"):
        for _ in range(2):
            got = generate(fast, prompt, 2)
    np.testing.assert_array_equal(got.generated, want.generated)
    assert (1, 7) in fast._prefill_failed and (1, 7) not in fast._prefill
    generate(fast, prompt, 2)  # no second capture attempt


def test_prefill_graphs_need_cuda_graphs_and_follow_the_environment(ckpt, monkeypatch):
    from gdn_export.runtime.cuda_graph import PREFILL_GRAPHS_ENV, prefill_graphs_default

    with pytest.raises(InputError, match="prefill graphs need CUDA graphs"):
        GraphRunner(load_checkpoint(ckpt), device="cpu", prefill_graphs=True)
    assert not GraphRunner(load_checkpoint(ckpt), device="cpu").prefill_graphs
    assert prefill_graphs_default(True) and not prefill_graphs_default(False)
    monkeypatch.setenv(PREFILL_GRAPHS_ENV, "0")
    assert not prefill_graphs_default(True)
    monkeypatch.setenv(PREFILL_GRAPHS_ENV, "yes")
    with pytest.raises(InputError, match="GDN_EXPORT_PREFILL_GRAPHS must be 0 or 1, got 'yes'"):
        prefill_graphs_default(True)
