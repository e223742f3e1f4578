"""`gdn-export validate`: exit 0 / 1 by the verdict, --json, tolerances and their overrides."""

from __future__ import annotations

import json

import pytest

from gdn_export.cli.common import parse_tolerances
from gdn_export.errors import InputError

SMALL = ["--batch", "1", "--prompt-len", "5", "--decode-steps", "1"]


def test_passes_and_writes_json(cli, tmp_path, tiny_ckpt, tiny_onnx):
    result = cli("validate", tiny_ckpt, "--onnx", tiny_onnx, "--json", tmp_path / "r.json", "-q")
    assert result.code == 0, result.out
    assert result.out.splitlines()[-1].startswith("PASS: ")
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["passed"] is True
    assert report["batch"] == 2 and report["prompt_len"] == 37 and report["decode_steps"] == 4
    rows = report["rows"]
    assert {r["phase"] for r in rows} == {"prefill", "decode 1", "decode 2", "decode 3", "decode 4"}
    assert {r["tensor"] for r in rows} >= {"logits", "past.0.conv", "past.0.recurrent", "past.1.key"}
    assert all(r["atol"] == 1e-4 and r["rtol"] == 1e-3 for r in rows)  # the fp32 defaults
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_zero_tolerance_fails_with_exit_1(cli, tiny_ckpt, tiny_onnx):
    result = cli("validate", tiny_ckpt, "--onnx", tiny_onnx, "--atol", "0", "--rtol", "0", *SMALL, "-q")
    assert result.code == 1
    lines = result.out.splitlines()
    assert lines[-1].startswith("FAIL: ")
    logit_rows = [line for line in lines if " logits " in line]
    assert len(logit_rows) == 2 and all(line.endswith("FAIL") for line in logit_rows)


def test_per_tensor_overrides(cli, tmp_path, tiny_ckpt, tiny_onnx):
    result = cli("validate", tiny_ckpt, "--onnx", tiny_onnx, *SMALL, "--json", tmp_path / "r.json",
                 "--atol", "2e-4", "logits:1e-3", "past.0.conv:0.5", "--rtol", "logits:0.25", "-q")
    assert result.code == 0, result.out
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    by_tensor = {r["tensor"]: (r["atol"], r["rtol"]) for r in rows}
    assert by_tensor["logits"] == (1e-3, 0.25)
    assert by_tensor["past.0.conv"] == (0.5, 1e-3)
    assert by_tensor["past.0.recurrent"] == (2e-4, 1e-3)


def test_fp16_onnx_is_checked_against_an_fp16_reference(cli, tmp_path, tiny_ckpt, exported):
    result = cli("validate", tiny_ckpt, "--onnx", exported("fp16"), *SMALL, "--logits-only",
                 "--json", tmp_path / "r.json", "-q")
    assert result.code == 0, result.out
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert all((r["atol"], r["rtol"]) == (3e-2, 3e-2) for r in rows)  # fp16 defaults
    assert " past." not in result.out  # --logits-only


def test_parse_tolerances_forms():
    tol = parse_tolerances(["1e-5", "logits:1e-3"], ["present.0.conv:0"], 1e-4, 1e-3)
    assert (tol.atol, tol.rtol) == (1e-5, 1e-3)
    assert tol.get("logits") == (1e-3, 1e-3)
    assert tol.get("present.0.conv") == (1e-5, 0.0)
    assert tol.get("past.9.key") == (1e-5, 1e-3)


@pytest.mark.parametrize("atol,fragment", [("logits:x", "'x' is not a number"),
                                          ("-1", "tolerances must be numbers >= 0"),
                                          ("nan", "tolerances must be numbers >= 0"),
                                          ("logits:", "'' is not a number")])
def test_parse_tolerances_rejects(atol, fragment):
    with pytest.raises(InputError, match=fragment):
        parse_tolerances([atol], [], 1e-4, 1e-3)


@pytest.mark.parametrize("args,fragment", [
    ([], "nothing to validate: give --onnx and/or --engine"),
    (["--onnx", "{onnx}", "--atol", "logits:abc"], "--atol 'logits:abc': 'abc' is not a number"),
    (["--onnx", "{onnx}", "--decode-steps", "-1"], "--decode-steps must be >= 0, got -1"),
    (["--onnx", "{onnx}", "--batch", "0"], "--batch must be >= 1, got 0"),
    (["--onnx", "{onnx}", "--json", "{tmp}/no/r.json"], "does not exist"),
    (["--onnx", "{tmp}/gone.onnx"], "{tmp}/gone.onnx: no such ONNX file"),
    (["--onnx", "{onnx}", "--engine", "{tmp}/gone.engine"], "{tmp}/gone.engine: no such engine file"),
], ids=["no-target", "bad-atol", "negative-decode-steps", "zero-batch", "json-folder-missing",
        "missing-onnx", "missing-engine"])
def test_mistakes_exit_2_before_running(cli, tmp_path, tiny_ckpt, tiny_onnx, args, fragment):
    args = [a.format(onnx=tiny_onnx, tmp=tmp_path) for a in args]
    result = cli("validate", tiny_ckpt, *args)
    assert fragment.format(tmp=tmp_path) in result.error_line("validate")
    assert result.out == ""


def test_missing_checkpoint_folder(cli, tmp_path, tiny_onnx):
    message = cli("validate", tmp_path / "nope", "--onnx", tiny_onnx).error_line("validate")
    assert message == f"{tmp_path / 'nope'}: checkpoint folder not found"


def test_override_of_an_unknown_tensor_is_an_error(cli, tiny_ckpt, tiny_onnx):
    """present.* (the output names) match no row: rows name states past.LAYER.KIND."""
    result = cli("validate", tiny_ckpt, "--onnx", tiny_onnx, "--atol", "present.0.conv:1", "-q")
    message = result.error_line("validate")
    assert "present.0.conv: no such tensor" in message and "past.0.conv" in message


@pytest.mark.parametrize("overrides,fragment", [
    (dict(num_hidden_layers=4), "has no state past.1.conv, which the checkpoint's model has"),
    (dict(vocab_size=300), "has vocab size 256, the checkpoint 300"),
    (dict(linear_num_value_heads=2), "state past.0.conv is ['batch', 160, 3] in --onnx"),
    (dict(family="qwen3_next"), "is a qwen3_5 model, the checkpoint qwen3_next"),
], ids=["more-layers", "larger-vocab", "fewer-value-heads", "other-family"])
def test_onnx_of_another_checkpoint(cli, tmp_path, tiny_onnx, overrides, fragment):
    """Without the check: a KeyError deep in run_parity, or an out-of-range token id."""
    from gdn_export.weights import make_tiny_checkpoint

    other = make_tiny_checkpoint(tmp_path / "other", **overrides)
    message = cli("validate", other, "--onnx", tiny_onnx, "-q").error_line("validate")
    assert fragment in message and message.endswith("was it exported from this checkpoint?")


def test_report_names_the_ragged_rows(cli, tmp_path, tiny_ckpt, tiny_onnx):
    """The default run is ragged on the inplace layout: rows of --prompt-len down to 1 token."""
    result = cli("validate", tiny_ckpt, "--onnx", tiny_onnx, "--batch", "3", "--prompt-len", "9",
                 "--decode-steps", "2", "--json", tmp_path / "r.json", "-q")
    assert result.code == 0, result.out
    assert "ragged prompts of 9, 5, 1 tokens" in result.out
    assert json.loads((tmp_path / "r.json").read_text())["prompt_lengths"] == [9, 5, 1]


FP16_STATE = ("--state-dtype", "fp16", "--max-cache-len", "64")


@pytest.mark.parametrize("flags,steps,atol", [
    (FP16_STATE, 12, 1e-4 + 1e-2),
    (["--attention-sinks", "2", "--attention-window", "8"], 30, 1e-4),
    (["--all-logits", "--max-cache-len", "64"], 3, 1e-4),
], ids=["fp16-state", "streaming-past-the-window", "all-logits"])
def test_layout_options_validate(cli, tmp_path, tiny_ckpt, exported, flags, steps, atol):
    """Each export layout option passes validate (PyTorch built with the file's layout vs ORT) at
    its default tolerance: the 16-bit state adds its share; streaming runs decode far past W."""
    result = cli("validate", tiny_ckpt, "--onnx", exported("fp32", *flags), "--decode-steps", str(steps),
                 "--json", tmp_path / "r.json", "-q")
    assert result.code == 0, result.out
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert len({r["phase"] for r in rows}) == steps + 1
    assert all(abs(r["atol"] - atol) < 1e-12 for r in rows)


def test_state_of_the_wrong_dtype_is_one_line(exported):
    """A --state-dtype fp16 file refuses an fp32 recurrent state, naming it."""
    import numpy as np

    from gdn_export.runtime.ort_runner import OrtRunner

    runner = OrtRunner(exported("fp32", *FP16_STATE))
    states = runner.empty_states(1)
    i = [s.name for s in runner.state_specs].index("past.0.recurrent")
    states[i] = states[i].astype(np.float32)
    with pytest.raises(InputError, match=r"^state past\.0\.recurrent must be float16, got float32$"):
        runner.forward(np.ones((1, 2), np.int64), 0, states)


def test_bf16_validate_prints_one_summary_line(capfd, tiny_ckpt, exported):
    """The bf16 emulation's K/V caches cannot be updated in place, and ORT says so at every call."""
    from gdn_export.cli.main import main

    assert main(["validate", str(tiny_ckpt), "--onnx", str(exported("bf16"))]) == 0
    err = capfd.readouterr().err
    assert "onnxruntime:" not in err
    summary = [line for line in err.splitlines() if "ONNX Runtime warned" in line]
    assert len(summary) == 1 and "TensorScatter: in-place optimization not activated" in summary[0], err
