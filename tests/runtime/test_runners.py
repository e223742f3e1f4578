"""TorchRunner and OrtRunner on a tiny exported checkpoint: same interface, same answers."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest

from gdn_export.errors import InputError
from gdn_export.runtime.base import generate
from gdn_export.runtime.ort_runner import OrtRunner
from gdn_export.runtime.torch_runner import TorchRunner
from tests.onnx._tiny import tiny_export


@pytest.fixture(scope="module")
def runners(tiny_root):
    model, path = tiny_export("qwen3_5", tiny_root)
    return TorchRunner(model), OrtRunner(path)


def test_ort_reads_state_specs_from_the_file(runners):
    torch_runner, ort_runner = runners
    assert ort_runner.state_specs == torch_runner.state_specs
    assert ort_runner.vocab_size == torch_runner.vocab_size
    assert (torch_runner.backend, ort_runner.backend) == ("torch", "ort")


def test_generate_agrees(runners):
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, runners[0].vocab_size, n) for n in (7, 1, 4)]
    a, b = (generate(r, prompts, 5) for r in runners)
    np.testing.assert_array_equal(a.generated, b.generated)
    assert a.generated.shape == (3, 5) and a.prompt_lengths.tolist() == [7, 1, 4]
    for x, y in zip(a.step_logits, b.step_logits):
        np.testing.assert_allclose(y, x, rtol=0, atol=1e-4)


def test_prefill_in_pieces_equals_one(runners):
    """T > 1 on top of P > 0 (a continued, chunked prefill) gives what one prefill of the whole
    prompt gives: the last logits and every state."""
    ids = np.random.default_rng(2).integers(0, runners[0].vocab_size, (2, 11))
    for runner in runners:
        whole, whole_states = runner.forward(ids, 0, runner.empty_states(2))
        want = runner.states_to_numpy(whole_states)
        _, states = runner.forward(ids[:, :6], 0, runner.empty_states(2))
        last, states = runner.forward(ids[:, 6:], 6, states)
        np.testing.assert_allclose(last, whole, rtol=0, atol=1e-4, err_msg=runner.backend)
        got = runner.states_to_numpy(states)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-4, err_msg=name)
        chunked = generate(runner, ids, 1, prefill_chunk=4).step_logits[0]
        np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-4, err_msg=runner.backend)


@pytest.mark.parametrize("which", ["torch", "ort"])
def test_state_errors(runners, which):
    runner = runners[0] if which == "torch" else runners[1]
    states = list(runner.empty_states(2))
    ids = np.ones((2, 1), np.int64)
    conv = runner.state_specs[0]
    assert conv.name == "past.0.conv"
    with pytest.raises(InputError, match="past.0.conv must be"):
        runner.forward(ids, 0, [states[0][:, :-1], *states[1:]])
    wrong_dtype = states[1].double() if which == "torch" else states[1].astype(np.float64)
    with pytest.raises(InputError, match="past.0.recurrent must be float32, got float64"):
        runner.forward(ids, 0, [states[0], wrong_dtype, *states[2:]])
    key = next(i for i, spec in enumerate(runner.state_specs) if spec.kind == "key")
    short = states[key][:, :, :-1]
    with pytest.raises(InputError, match=rf"past.{runner.state_specs[key].layer}.key must be"):
        runner.forward(ids, 0, [*states[:key], short, *states[key + 1:]])
    with pytest.raises(InputError, match="exceed the cache of 160 slots"):
        runner.forward(ids, 160, states)
    with pytest.raises(InputError, match=f"expected {len(runner.state_specs)} state tensors"):
        runner.forward(ids, 0, states[:-1])


def test_ort_runner_rejects_other_files(tmp_path):
    with pytest.raises(InputError, match="no such ONNX file"):
        OrtRunner(tmp_path / "absent.onnx")
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "g", [x],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    path = tmp_path / "other.onnx"
    onnx.save(onnx.helper.make_model(graph), path)
    with pytest.raises(InputError, match=f"^{re.escape(str(path))}: not a gdn-export graph"):
        OrtRunner(path)


@pytest.mark.parametrize("data", [b"not protobuf \xff\xfe", b"\x08"], ids=["junk", "truncated"])
def test_ort_runner_names_a_corrupt_file(tmp_path, data):
    path = tmp_path / "corrupt.onnx"
    path.write_bytes(data)
    with pytest.raises(InputError, match=f"^{re.escape(str(path))}: not an ONNX model"):
        OrtRunner(path)
