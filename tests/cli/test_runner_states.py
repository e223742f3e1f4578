"""Through the Python API the CLI uses: a state of the wrong shape, dtype, batch or count is an
InputError that names the state and what was expected."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_export.errors import InputError
from gdn_export.runtime.ort_runner import OrtRunner
from gdn_export.runtime.torch_runner import TorchRunner
from gdn_export.weights import load_checkpoint

IDS = np.array([[3, 1, 4]])


@pytest.fixture(scope="module", params=["torch", "ort"])
def runner(request, tiny_ckpt, tiny_onnx):
    return TorchRunner(load_checkpoint(tiny_ckpt)) if request.param == "torch" else OrtRunner(tiny_onnx)


def _cast(runner, x, dtype_name):
    if isinstance(x, torch.Tensor):
        return x.to(getattr(torch, dtype_name))
    return x.astype(dtype_name)


def _index(runner, name):
    return [s.name for s in runner.state_specs].index(name)


def test_wrong_shape_names_the_state(runner):
    states = list(runner.empty_states(1))
    i = _index(runner, "past.0.recurrent")
    states[i] = states[i][:, :3]  # 3 value heads instead of 4
    with pytest.raises(InputError) as info:
        runner.forward(IDS, 0, states)
    message = str(info.value)
    assert "state past.0.recurrent" in message and "(1, 4, 16, 24)" in message and "(1, 3, 16, 24)" in message


def test_wrong_dtype_names_the_state(runner):
    states = list(runner.empty_states(1))
    i = _index(runner, "past.0.conv")
    states[i] = _cast(runner, states[i], "float16")
    with pytest.raises(InputError, match=r"state past\.0\.conv must be float32, got float16"):
        runner.forward(IDS, 0, states)


def test_states_of_another_batch(runner):
    with pytest.raises(InputError, match=r"state past\.0\.conv must be \(1, .* for batch 1 .* got \(2, "):
        runner.forward(IDS, 0, runner.empty_states(2))


def test_cache_of_the_wrong_length(runner):
    states = list(runner.empty_states(1))
    i = _index(runner, "past.1.key")
    states[i] = states[i][:, :, :100]
    with pytest.raises(InputError, match=r"state past\.1\.key must be \(1, 2, 4096, 16\) .* got \(1, 2, 100, 16\)"):
        runner.forward(IDS, 4, states)


def test_past_length_beyond_the_cache(runner):
    with pytest.raises(InputError, match=r"rows at past lengths \[4094\] plus 3 tokens exceed the cache of 4096"):
        runner.forward(IDS, 4094, runner.empty_states(1))


def test_wrong_recurrent_state_dtype_is_named(runner):
    states = list(runner.empty_states(1))
    i = _index(runner, "past.0.recurrent")
    states[i] = _cast(runner, states[i], "float16")
    with pytest.raises(InputError, match=r"state past\.0\.recurrent must be float32, got float16"):
        runner.forward(IDS, 0, states)


def test_missing_state(runner):
    with pytest.raises(InputError, match="expected 4 state tensors, got 3"):
        runner.forward(IDS, 0, list(runner.empty_states(1))[:-1])


def test_torch_runner_given_numpy_states(tiny_ckpt):
    runner = TorchRunner(load_checkpoint(tiny_ckpt))
    states = [t.numpy() for t in runner.empty_states(1)]
    with pytest.raises(InputError, match="^state past.0.conv must be a torch.Tensor for the torch "
                       "runner, got numpy.ndarray$"):
        runner.forward(IDS, 0, states)
