"""OrtRunner's device path (gdn_export.runtime.ort_device) on the CPU provider: IOBinding on OrtValue
states, K/V caches in place, GDN states ping-ponged between two buffers; and the one-line errors for
CUDA without onnxruntime-gpu."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from gdn_export.errors import InputError
from gdn_export.runtime import ort_device
from gdn_export.runtime.base import generate
from gdn_export.runtime.ort_runner import OrtRunner
from tests.onnx._tiny import CONCAT, tiny_export


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny_device")


@pytest.mark.parametrize("layout", ["inplace", "concat"])
def test_device_buffers_give_the_host_path_results(tiny_root, layout):
    kwargs = {"layout": CONCAT} if layout == "concat" else {}
    _, path = tiny_export("qwen3_5", tiny_root, **kwargs)
    host, dev = OrtRunner(path), OrtRunner(path, device_buffers=True)
    assert dev.device_buffers and not host.device_buffers
    prompts = [np.arange(3, 20), np.arange(5, 22)] if layout == "concat" else [np.arange(3, 20), np.arange(7, 9)]
    a, b = generate(host, prompts, 6), generate(dev, prompts, 6)
    np.testing.assert_array_equal(a.generated, b.generated)
    for x, y in zip(a.step_logits, b.step_logits):
        np.testing.assert_array_equal(x, y)


def test_states_stay_ortvalues_kv_in_place_and_gdn_states_swap_buffers(tiny_root):
    _, path = tiny_export("qwen3_5", tiny_root)
    runner = OrtRunner(path, device_buffers=True)
    states = runner.empty_states(2)
    assert all(isinstance(s, ort.OrtValue) for s in states)
    _, s1 = runner.forward(np.ones((2, 4), np.int64), 0, states)
    _, s2 = runner.forward(np.ones((2, 1), np.int64), 4, s1)
    for spec, a, b, c in zip(runner.state_specs, states, s1, s2):
        if spec.kind in ("key", "value"):
            assert a is b is c  # one buffer, written in place
            assert np.abs(c.numpy()[:, :, :5]).sum() > 0 and not c.numpy()[:, :, 5:].any()
        else:  # two buffers a state: step 2 writes into step 1's input buffer
            assert b is not a and c is a
    got = runner.states_to_numpy(s2)
    host = OrtRunner(path)
    _, h1 = host.forward(np.ones((2, 4), np.int64), 0, host.empty_states(2))
    _, h2 = host.forward(np.ones((2, 1), np.int64), 4, h1)
    for name, want in host.states_to_numpy(h2).items():
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_numpy_states_are_refused_by_the_device_path(tiny_root):
    _, path = tiny_export("qwen3_5", tiny_root)
    runner = OrtRunner(path, device_buffers=True)
    with pytest.raises(InputError, match="keeps its states on the device"):
        runner.forward(np.ones((2, 1), np.int64), 0, OrtRunner(path).empty_states(2))


def test_cuda_without_onnxruntime_gpu_is_one_line(tiny_root, monkeypatch):
    _, path = tiny_export("qwen3_5", tiny_root)
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(InputError) as err:
        OrtRunner(path, device="cuda")
    msg = str(err.value)
    assert "\n" not in msg and "needs onnxruntime-gpu" in msg and "pip install onnxruntime-gpu" in msg


def test_cuda_providers_when_onnxruntime_gpu_is_there(monkeypatch):
    calls = []
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "preload_dlls", lambda *a, **k: calls.append(1), raising=False)
    assert ort_device.providers_for(ort_device.parse_device("cuda:1")) == [
        ("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]
    assert calls == [1]


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "cuda:", "tpu:0"])
def test_bad_device_names(bad):
    with pytest.raises(InputError, match="ONNX Runtime runs on cpu, cuda or cuda:N"):
        ort_device.parse_device(bad)
