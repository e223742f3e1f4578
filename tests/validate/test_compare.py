"""run_parity, Report and write_json on small numpy runners (no model needed): a missing state is
a failed row, impossible sizes are InputErrors, an empty report never passes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gdn_export.errors import GdnExportError, InputError
from gdn_export.layout import DeployLayout
from gdn_export.runtime.base import Runner, StateInfo, check_states
from gdn_export.validate import Report, Row, Tolerances, format_table, run_parity, write_json

VOCAB = 13
SPECS = [StateInfo("past.0.conv", "present.0.conv", ("batch", 5, 3), "float32", 0, "conv"),
         StateInfo("past.1.key", "present.1.key", ("batch", 2, "past", 4), "float32", 1, "key")]


class ToyRunner(Runner):
    """logits = a fixed projection of the token ids plus `offset`; states count tokens."""

    layout = DeployLayout.make(kv_cache="concat", logits="all")

    def __init__(self, backend: str, offset: float = 0.0, drop: str | None = None):
        self.backend, self.offset, self.drop = backend, offset, drop
        self.state_specs, self.vocab_size = SPECS, VOCAB

    def empty_states(self, batch):
        return [np.zeros(s.concrete_shape(batch, 0), np.float32) for s in SPECS]

    def _forward(self, input_ids, past_lengths, seq_lens, states):
        batch, seq = input_ids.shape
        check_states(SPECS, [(s.shape, s.dtype.name) for s in states], batch, int(past_lengths[0]))
        table = np.cos(np.arange(VOCAB * VOCAB, dtype=np.float32).reshape(VOCAB, VOCAB))
        logits = table[input_ids] + np.float32(self.offset)
        conv = states[0] + input_ids.sum(1, dtype=np.float32)[:, None, None]
        key = np.concatenate([states[1], np.ones((batch, 2, seq, 4), np.float32)], axis=2)
        return logits, [conv, key]

    def states_to_numpy(self, states):
        return {s.name: x for s, x in zip(SPECS, states) if s.name != self.drop}


TOL = Tolerances(1e-4, 1e-3)


def _parity(candidate, **kwargs):
    kwargs = {"batch": 2, "prompt_len": 3, "decode_steps": 2, **kwargs}
    return run_parity(ToyRunner("ref"), [candidate], vocab_size=VOCAB, tolerances=TOL, **kwargs)


def test_identical_runners_pass_every_row():
    report = _parity(ToyRunner("same"))
    assert report.passed
    assert [(r.phase, r.tensor) for r in report.rows] == [
        ("prefill", "logits"), ("prefill", "past.0.conv"), ("prefill", "past.1.key"),
        ("decode 1", "logits"),
        ("decode 2", "logits"), ("decode 2", "past.0.conv"), ("decode 2", "past.1.key")]


def test_logit_offset_fails_the_logit_rows_only():
    report = _parity(ToyRunner("off", offset=0.01))
    assert not report.passed
    assert {r.tensor for r in report.rows if not r.passed} == {"logits"}


def test_missing_state_is_a_failed_row_not_a_key_error():
    report = _parity(ToyRunner("lacks-key", drop="past.1.key"))
    missing = [r for r in report.rows if r.note]
    assert [(r.phase, r.tensor, r.note, r.passed) for r in missing] == [
        ("prefill", "past.1.key", "missing", False), ("decode 2", "past.1.key", "missing", False)]
    assert np.isnan(missing[0].max_abs)
    assert not report.passed
    table = format_table(report)
    assert "FAIL (missing)" in table and table.splitlines()[-1] == "FAIL: 2 of 7 tensors over tolerance"


def test_per_tensor_override_by_state_name():
    """The Tolerances docstring's example: rows name states past.*, so past.0.conv applies."""
    tol = Tolerances(1e-4, 1e-3, {"past.0.conv": (0.5, None)})
    report = run_parity(ToyRunner("ref"), [ToyRunner("b")], vocab_size=VOCAB, tolerances=tol,
                        batch=1, prompt_len=2, decode_steps=0)
    assert {r.tensor: r.atol for r in report.rows} == {"logits": 1e-4, "past.0.conv": 0.5,
                                                       "past.1.key": 1e-4}


@pytest.mark.parametrize("kwargs,message", [
    ({"decode_steps": -1}, "decode_steps must be >= 0, got -1"),
    ({"batch": 0}, "batch must be >= 1, got 0"),
    ({"prompt_len": 0}, "prompt_len must be >= 1, got 0"),
    ({"batch": True}, "batch must be an integer, got True"),
    ({"decode_steps": 1.5}, "decode_steps must be an integer, got 1.5"),
], ids=["negative-decode-steps", "zero-batch", "zero-prompt", "bool-batch", "float-steps"])
def test_impossible_sizes_are_input_errors(kwargs, message):
    with pytest.raises(InputError, match=f"^{message}$"):
        _parity(ToyRunner("b"), **kwargs)


def test_a_report_with_no_rows_has_not_passed():
    report = Report("ref", 1, 1, 0, 0)
    assert report.passed is False and report.to_dict()["passed"] is False
    assert format_table(report).splitlines()[-1] == "FAIL: no tensors were compared"
    report.rows.append(Row("b", "prefill", "logits", 0.0, 0.0, 1e-4, 1e-3, True))
    assert report.passed is True


def test_write_json_round_trip(tmp_path):
    report = _parity(ToyRunner("lacks-key", drop="past.1.key"))
    write_json(report, tmp_path / "r.json")
    d = json.loads((tmp_path / "r.json").read_text())
    assert d["passed"] is False and d["rows"][2]["note"] == "missing"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left


def test_write_json_names_a_missing_folder(tmp_path):
    message = f"^{tmp_path / 'no'}: folder for the JSON report does not exist$"
    with pytest.raises(GdnExportError, match=message):
        write_json(Report("ref", 1, 1, 0, 0), tmp_path / "no" / "r.json")
    assert list(tmp_path.iterdir()) == []


def test_write_json_refuses_a_folder(tmp_path):
    (tmp_path / "r.json").mkdir()
    with pytest.raises(GdnExportError, match="r.json: is a folder"):
        write_json(Report("ref", 1, 1, 0, 0), tmp_path / "r.json")


def test_the_step_bound_passes_named_rows_only_within_it():
    """A second bound (static FP8 activations: one e4m3 rounding step) passes a row over the tight
    tolerance with its note; the tight tolerance stays what the table shows, and beyond the step
    bound the row fails."""
    tol = Tolerances(1e-4, 1e-3, step=(0.3, 0.1), step_note="one e4m3 rounding step")
    near = _parity(ToyRunner("near", offset=0.05))
    report = run_parity(ToyRunner("ref"), [ToyRunner("near", offset=0.05)], vocab_size=VOCAB, tolerances=tol,
                        batch=2, prompt_len=3, decode_steps=2)
    logits = [r for r in report.rows if r.tensor == "logits"]
    assert report.passed and not near.passed
    assert all(r.note == "one e4m3 rounding step" and (r.atol, r.rtol) == (1e-4, 1e-3) for r in logits)
    assert all(r.note == "" for r in report.rows if r.tensor != "logits")
    text = format_table(report)
    assert "ok (one e4m3 rounding step)" in text
    assert text.splitlines()[-1] == "PASS: 7 tensors within tolerance (3 of them only within one e4m3 rounding step)"
    far = run_parity(ToyRunner("ref"), [ToyRunner("far", offset=2.0)], vocab_size=VOCAB, tolerances=tol,
                     batch=2, prompt_len=3, decode_steps=2)
    assert not far.passed and all(not r.passed and r.note == "" for r in far.rows if r.tensor == "logits")


def test_the_step_bound_is_per_tensor_where_given():
    tol = Tolerances(1e-4, 1e-3, step=(0.3, 0.1), step_note="step", step_per_tensor={"logits": (0.0, 0.0)})
    report = run_parity(ToyRunner("ref"), [ToyRunner("near", offset=0.05)], vocab_size=VOCAB, tolerances=tol,
                        batch=2, prompt_len=3, decode_steps=2)
    assert not report.passed


@pytest.mark.parametrize("quantization, dtype, step", [
    ("fp8", "float32", (0.3, 0.1)), ("fp8", "bfloat16", (1.0, 0.3)), ("fp8,int4-awq", "float16", (1.0, 0.3)),
    ("int4-awq", "float32", None), ("fp8-block128", "bfloat16", None), ("none", "float32", None)])
def test_only_static_fp8_activations_get_the_step(quantization, dtype, step):
    from gdn_export.quantize.report import rounding_step

    class Meta:
        metadata = {"gdn_export.quantization": quantization, "gdn_export.dtype": dtype}

    assert rounding_step(Meta()) == step
