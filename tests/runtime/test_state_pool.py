"""Runner calls into rows of a larger state buffer (what gdn-export serve runs on): TorchRunner.step on
row slices, GraphRunner.bind_states / decode_rows on the first n rows of a pool, against the same
rows generated alone. On a GPU the decode steps replay the graphs captured per bound batch size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_export.errors import InputError
from gdn_export.layout import DeployLayout
from gdn_export.runtime.base import generate
from gdn_export.runtime.cuda_graph import GraphRunner
from gdn_export.runtime.torch_runner import TorchRunner
from gdn_export.weights import load_checkpoint, make_tiny_checkpoint
from tests.onnx._tiny import TWO_LAYERS
from tests.runtime.test_cuda_graph import DEVICES

LAYOUT = DeployLayout.make(cache_len=48)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("pool") / "ckpt", family="qwen3_5", seed=4, **TWO_LAYERS)


def _model(ckpt):
    model = load_checkpoint(ckpt, dtype=torch.float32)
    model.layout = LAYOUT
    return model


def test_step_writes_into_row_slices(ckpt):
    """A prefill of two rows through `step` into rows 1..2 of a 4-row buffer: the logits and the
    rows' states are what `forward` gives on fresh states; rows 0 and 3 are untouched."""
    runner = TorchRunner(_model(ckpt))
    ids = np.random.default_rng(0).integers(0, runner.vocab_size, (2, 9))
    want, want_states = runner.forward(ids, 0, runner.empty_states(2), [9, 5])
    buffer = [torch.full_like(t, 7.0) for t in runner.model.empty_states(4)]
    for t in buffer:
        t[1:3].zero_()
    logits = runner.step(torch.from_numpy(ids), torch.zeros(2, dtype=torch.int64), torch.tensor([9, 5]),
                         [t[1:3] for t in buffer])
    np.testing.assert_allclose(logits.numpy(), want, rtol=0, atol=1e-5)
    for t, w in zip(buffer, want_states):
        torch.testing.assert_close(t[1:3], w, rtol=0, atol=1e-5)
        assert bool((t[0] == 7).all() and (t[3] == 7).all())


@pytest.mark.parametrize("device", DEVICES)
def test_decode_rows_on_a_bound_pool(ckpt, device):
    """Three rows prefilled into a pool of 5 bound at sizes 1, 2, 4, 5, then decoded 6 steps as 3 rows
    (run at size 4 on a GPU), then 2 rows after the last one leaves: the tokens of generate alone."""
    eager = TorchRunner(_model(ckpt), device=device)
    fast = GraphRunner(_model(ckpt), device=device)
    pool = fast.model.empty_states(5, device=device)
    fast.bind_states(pool, [1, 2, 4, 5])
    assert all(float(t.abs().sum()) == 0 for t in pool), "the pool is zeroed after the captures"
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, eager.vocab_size, n) for n in (7, 3, 11)]
    want = [generate(eager, [p], 9).generated[0] for p in prompts]
    dev = fast.device
    for i, p in enumerate(prompts):  # each prompt into its own pool row
        logits = fast.step(torch.from_numpy(p)[None].to(dev), torch.zeros(1, dtype=torch.int64, device=dev),
                           torch.tensor([len(p)], device=dev), [t[i:i + 1] for t in pool])
        assert int(logits[0, -1].argmax()) == want[i][0]
    tokens = torch.tensor([w[0] for w in want], device=dev)
    past = torch.tensor([len(p) for p in prompts], device=dev)
    got = []
    for step in range(8):
        rows = 3 if step < 6 else 2
        logits, greedy = fast.decode_rows(tokens[:rows], past[:rows])
        assert logits.shape == (rows, 1, fast.vocab_size)
        torch.testing.assert_close(greedy, logits[:, -1].argmax(-1))
        got.append(greedy.cpu().tolist())
        tokens, past = greedy.clone(), past[:rows] + 1
    for i in range(3):
        steps = 6 if i == 2 else 8
        assert [g[i] for g in got[:steps]] == want[i][1:1 + steps].tolist(), i


def test_pool_errors(ckpt):
    fast = GraphRunner(_model(ckpt), device="cpu")
    with pytest.raises(InputError, match="decode_rows needs a state pool"):
        fast.decode_rows(torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    pool = fast.model.empty_states(3)
    with pytest.raises(InputError, match=r"batch sizes \[2, 4\] must lie in \[1, 3\]"):
        fast.bind_states(pool, [2, 4])
    fast.bind_states(pool, [1, 2])
    with pytest.raises(InputError, match="3 rows exceed the largest bound batch size 2"):
        fast.decode_rows(torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(InputError, match=r"batch size 3 is not one of the sizes bound to the state pool \(\[1, 2\]\)"):
        fast.empty_states(3)
