"""TrtRunner: prefill then cached decode through a real engine against the PyTorch model.

Needs a CUDA GPU that the installed TensorRT can run on (TensorRT-RTX 1.7 refuses sm_90, so on an
H200 only full TensorRT 10.x/11.x runs these); without one they skip with the reason. The only
CPU-side check is that the runner refuses to start without a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_export.errors import GdnExportError, InputError


def test_runner_without_gpu_says_so(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from gdn_export.trt.runtime import TrtRunner

    (tmp_path / "model.engine").write_bytes(b"engine")
    with pytest.raises(GdnExportError, match="needs a CUDA GPU"):
        TrtRunner(tmp_path / "model.engine")


@pytest.fixture(scope="session")  # session: checked before the session-scoped plugin build
def runnable(trt_flavour):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (none found); TensorRT engines cannot run here")
    major, minor = torch.cuda.get_device_capability()
    if trt_flavour == "tensorrt_rtx" and (major, minor) == (9, 0):
        pytest.skip("TensorRT-RTX does not run on compute capability 9.0 (install full TensorRT)")
    return trt_flavour


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", "qwen3_5_moe", "olmo_hybrid"])
def test_prefill_then_decode_matches_torch(runnable, plugins_lib, tiny_root, family):
    from gdn_export.runtime.torch_runner import TorchRunner
    from gdn_export.trt import build_engine
    from gdn_export.trt.runtime import TrtRunner
    from tests.onnx._tiny import tiny_export

    model, onnx_path = tiny_export(family, tiny_root)
    engine = build_engine(onnx_path, tiny_root / f"{family}-run.engine", plugins=plugins_lib,
                          max_shapes="input_ids:[3,80]")
    trt_runner = TrtRunner(engine, plugins=plugins_lib)
    torch_runner = TorchRunner(model)
    ids = np.random.default_rng(0).integers(0, trt_runner.vocab_size, size=(3, 65))
    states_t, states_r = trt_runner.empty_states(3), torch_runner.empty_states(3)
    logits_t, states_t = trt_runner.forward(ids, 0, states_t)
    logits_r, states_r = torch_runner.forward(ids, 0, states_r)
    _close(logits_t, logits_r, "prefill logits")
    past = ids.shape[1]
    for step in range(3):
        token = logits_r[:, -1].argmax(-1)[:, None].astype(np.int64)
        logits_t, states_t = trt_runner.forward(token, past, states_t)
        logits_r, states_r = torch_runner.forward(token, past, states_r)
        _close(logits_t, logits_r, f"decode step {step} logits")
        past += 1
    got, want = trt_runner.states_to_numpy(states_t), torch_runner.states_to_numpy(states_r)
    for name in want:
        _close(got[name], want[name], name)


@pytest.mark.gpu
def test_stale_states_are_refused(runnable, plugins_lib, tiny_root):
    from gdn_export.trt import build_engine
    from gdn_export.trt.runtime import TrtRunner
    from tests.onnx._tiny import tiny_export

    _, onnx_path = tiny_export("qwen3_5", tiny_root)
    engine = build_engine(onnx_path, tiny_root / "stale.engine", plugins=plugins_lib)
    runner = TrtRunner(engine, plugins=plugins_lib)
    first = runner.empty_states(1)
    _, second = runner.forward(np.array([[1, 2, 3]]), 0, first)
    with pytest.raises(InputError, match="updated in place"):
        runner.forward(np.array([[4]]), 3, first)
    runner.forward(np.array([[4]]), 3, second)


def _close(actual, expected, name, bound=2e-3):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert not np.isnan(actual).any(), f"{name}: NaN"
    err = np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30)
    assert err <= bound, f"{name}: relative RMS {err:.3g} > {bound}"
