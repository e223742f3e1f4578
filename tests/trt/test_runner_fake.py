"""TrtRunner on CPU against a recording stand-in of the TensorRT runtime (tests/trt/fake_trt.py):
the binding sequence step by step, profile choice, streams, and the checks before a run."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_export.errors import GdnExportError, InputError
from gdn_export.trt.runtime import TrtRunner
from tests.trt.fake_trt import FakeCuda, FakeTrt, write_engine

STATES = ["past.0.conv", "past.0.recurrent", "past.1.key", "past.1.value"]


def _runner(tmp_path, trt=None, **engine):
    path = write_engine(tmp_path / "fake.engine", **engine)
    trt = trt or FakeTrt()
    cuda = FakeCuda()
    return TrtRunner(path, trt=trt, cuda=cuda), trt, cuda


def _calls(trt, kind):
    return [c for c in trt.calls if c[0] == kind]


def _step(runner, ids, states, past=None, lens=None):
    ids = np.asarray(ids, np.int64)
    past = states.seen if past is None else np.asarray(past, np.int64)
    lens = np.full(ids.shape[0], ids.shape[1], np.int64) if lens is None else np.asarray(lens, np.int64)
    return runner.forward(ids, past, states, lens)


def test_states_bound_once_same_address_for_past_and_present(tmp_path):
    runner, trt, cuda = _runner(tmp_path)
    assert runner.in_place == [True, True, True, True]  # plugins from the record, K/V from the engine
    states = runner.empty_states(2)
    logits, states = _step(runner, [[1, 2, 3], [4, 5, 0]], states, lens=[3, 2])
    assert logits.shape == (2, 1, 11) and logits[:, 0, 0].tolist() == [3.0, 1002.0]
    first = {name: addr for _, name, addr in _calls(trt, "set_tensor_address")}
    for name in STATES:
        assert first[name] == first["present" + name[4:]], name
    for _ in range(3):  # decode: one switch to the decode profile, then nothing is bound again
        logits, states = _step(runner, [[7], [8]], states)
    addresses = _calls(trt, "set_tensor_address")
    after_switch = [c for c in trt.calls[trt.calls.index(_calls(trt, "set_optimization_profile_async")[1]):]
                    if c[0] == "set_tensor_address"]
    assert len(addresses) == len(first) + len(after_switch)
    assert {name: addr for _, name, addr in after_switch} == first  # same buffers on the decode profile
    assert len(after_switch) == len(first)  # bound once per profile switch, not per step
    # The states flowed through in place: +1 per step (prefill and three decodes).
    for name, value in runner.states_to_numpy(states).items():
        assert np.all(value == 4), name
    assert states.seen.tolist() == [6, 5]


def test_profile_switch_between_prefill_and_decode(tmp_path):
    runner, trt, _ = _runner(tmp_path)
    states = runner.empty_states(1)
    _, states = _step(runner, [[1, 2, 3, 4]], states)
    _, states = _step(runner, [[5]], states)
    _, states = _step(runner, [[6]], states)
    _, states = _step(runner, [[1, 2]], states)  # a second prefill chunk goes back to profile 0
    switches = [c[1] for c in _calls(trt, "set_optimization_profile_async")]
    assert switches == [0, 1, 0]
    shapes = _calls(trt, "set_input_shape")
    # Shapes are set after every switch and when they change, not repeated otherwise.
    decode_shapes = [c for c in shapes if c[1] == "input_ids"]
    assert [c[2] for c in decode_shapes] == [(1, 4), (1, 1), (1, 2)]


def test_own_stream_ordered_against_the_caller(tmp_path):
    runner, trt, cuda = _runner(tmp_path)
    own = cuda.streams[0].handle
    assert own != cuda.caller.handle and own != 0  # not the caller's, not the legacy default stream
    states = runner.empty_states(1)
    cuda.log.clear()
    _step(runner, [[1, 2]], states)
    assert {c[1] for c in _calls(trt, "execute_async_v3")} == {own}
    assert {c[2] for c in _calls(trt, "set_optimization_profile_async")} == {own}
    log = cuda.log
    assert log[0] == ("on", own) and log[1] == ("wait", own, cuda.caller.handle)  # after the caller's work
    assert all(entry[1] == own for entry in log if entry[0] in ("upload", "to_host"))
    assert log[-1] == ("wait", cuda.caller.handle, own)  # the caller's later work after the step


def test_stale_and_mismatched_states_are_refused(tmp_path):
    runner, _, _ = _runner(tmp_path)
    first = runner.empty_states(2)
    _, second = _step(runner, [[1, 2], [3, 4]], first)
    with pytest.raises(InputError, match="updated in place"):
        _step(runner, [[5], [6]], first)
    with pytest.raises(InputError, match="do not match the states"):
        _step(runner, [[5], [6]], second, past=[2, 1])
    with pytest.raises(InputError, match="states are for batch 2"):
        _step(runner, [[5]], second, past=[2])
    _step(runner, [[5], [6]], second)


@pytest.mark.parametrize("kwargs,match", [
    (dict(ids=[[1, 2]], lens=[3]), r"seq_lens must be \[0, 2\], got \[3\]"),
    (dict(ids=[[1, 2]], lens=[-1]), r"seq_lens must be \[0, 2\], got \[-1\]"),
    (dict(ids=[[1, 2]], lens=[2, 2]), r"seq_lens must have one entry per row \(1\)"),
    (dict(ids=[[1] * 17]), "fits none of the engine's profiles"),
], ids=["len-above-width", "len-negative", "len-count", "seq-above-prefill"])
def test_bad_lengths_and_shapes_name_the_problem(tmp_path, kwargs, match):
    runner, trt, _ = _runner(tmp_path)
    states = runner.empty_states(len(kwargs["ids"]))
    with pytest.raises(InputError, match=match):
        _step(runner, kwargs["ids"], states, lens=kwargs.get("lens"))
    assert not _calls(trt, "execute_async_v3")


def test_batch_and_cache_limits_are_refused(tmp_path):
    runner, _, _ = _runner(tmp_path, cache_len=8, prefill=8)
    with pytest.raises(InputError, match="batch 5 is outside the engine's profiles \\(1 .. 4\\)"):
        runner.empty_states(5)
    _, states = _step(runner, [[1] * 8], runner.empty_states(1))
    with pytest.raises(InputError, match="exceed the cache of 8 slots"):
        _step(runner, [[1]], states)


def test_inferred_output_shape_is_checked_before_binding(tmp_path, monkeypatch):
    runner, trt, _ = _runner(tmp_path)
    context = trt.contexts[0]
    monkeypatch.setattr(context, "get_tensor_shape", lambda name: (-1, 1, 11) if name == "logits" else (1,))
    with pytest.raises(GdnExportError, match=r"infers logits \[-1, 1, 11\]"):
        _step(runner, [[1]], runner.empty_states(1))
    assert not _calls(trt, "set_tensor_address") and not _calls(trt, "execute_async_v3")


def test_engine_of_another_tensorrt_is_refused(tmp_path):
    with pytest.raises(GdnExportError) as info:
        _runner(tmp_path, trt=FakeTrt("tensorrt", "10.15.1"))
    message = str(info.value)
    assert "\n" not in message
    assert "built by tensorrt_rtx 1.7.1.116, this is tensorrt 10.15.1" in message


def test_ping_pong_where_the_engine_keeps_the_input(tmp_path):
    """A state TensorRT does not update in place (another reader of past.*: `state_aliasing` says
    separate) and the growing K/V of the concat layout get two buffers that swap each step."""
    runner, trt, _ = _runner(tmp_path, layout="concat", plugin_alias="separate")
    assert runner.in_place == [True, False, False, False]
    states = runner.empty_states(1)
    _, states = _step(runner, [[1, 2, 3]], states)
    _, states = _step(runner, [[4]], states)
    _, states = _step(runner, [[5]], states)
    bound = _calls(trt, "set_tensor_address")
    rec_in = [c[2] for c in bound if c[1] == "past.0.recurrent"]
    rec_out = [c[2] for c in bound if c[1] == "present.0.recurrent"]
    assert rec_in[1] == rec_out[0] and rec_out[1] == rec_in[0] and rec_in[0] != rec_out[0]
    got = runner.states_to_numpy(states)
    assert np.all(got["past.0.recurrent"] == 3) and np.all(got["past.0.conv"] == 3)
    assert got["past.1.key"].shape == (1, 2, 5, 4)
    with pytest.raises(InputError, match="need the inplace kv cache layout"):
        _step(runner, [[1, 2]], states, lens=[1])


def test_runtime_config_is_set_deliberately(tmp_path):
    path = write_engine(tmp_path / "fake.engine")
    trt = FakeTrt()
    runner = TrtRunner(path, trt=trt, cuda=FakeCuda(), kernel_specialization="eager")
    config = trt.contexts[0].config
    assert config.dynamic_shapes_kernel_specialization_strategy.name == "EAGER"
    assert config.cuda_graph_strategy.name == "DISABLED"
    assert runner.kernel_specialization == "eager"
    with pytest.raises(InputError, match="kernel_specialization must be one of"):
        TrtRunner(path, trt=trt, cuda=FakeCuda(), kernel_specialization="fast")


def test_old_call_form_still_works(tmp_path):
    runner, _, _ = _runner(tmp_path, logits="all")
    states = runner.empty_states(2)
    logits, states = runner.forward(np.array([[1, 2, 3], [4, 5, 6]]), 0, states)
    assert logits.shape == (2, 3, 11) and states.seen.tolist() == [3, 3]
    logits, states = runner.forward(np.array([[1], [2]]), 3, states)
    assert logits.shape == (2, 1, 11)


def test_an_engine_of_a_speculative_graph_is_refused(tmp_path):
    """An engine built from model.verify.onnx / model.mtp.onnx (its build record's metadata says) is
    named as such before TensorRT loads it."""
    import json

    from gdn_export.trt.build import layers_path

    path = write_engine(tmp_path / "m.verify.engine")
    record = json.loads(layers_path(path).read_text())
    record["metadata"]["gdn_export.speculative"] = "verify"
    layers_path(path).write_text(json.dumps(record))
    with pytest.raises(InputError, match="an engine of the verify graph of `export --speculative`"):
        TrtRunner(path, trt=FakeTrt(), cuda=FakeCuda())
