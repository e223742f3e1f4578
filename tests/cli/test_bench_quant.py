"""`gdn-export bench --quant`: the 16-bit and the quantized model side by side in one run (CPU,
tiny checkpoint): the JSON keys of both, the ratios, the accuracy keys, the table, user errors."""

from __future__ import annotations

import json
import tempfile

import pytest

pytest.importorskip("modelopt")

SMALL = ("--batch", 2, "--prompt-len", 9, "--decode-steps", 2, "--warmup", 0, "--repeats", 1, "-q",
         "--quant-steps", 5, "--calib-samples", 2, "--calib-seq-len", 16)
TIMING_KEYS = ("prefill_ms", "decode_ms_per_step", "decode_tokens_per_s", "prefill_runs_ms",
               "decode_runs_ms_per_step", "peak_memory_bytes", "peak_memory_source", "parameters",
               "weights_bytes", "states_bytes", "prefill_chunk")
# Last-position logits distance to the 16-bit model on the tiny random model (it amplifies
# rounding; tests/quantize/test_calibrate.py measured fp8 0.2-0.45, int4-awq 0.5-1.04 on larger
# tiny models): the bounds catch a blow-up or a comparison of a model with itself.
BOUND = {"fp8": 0.6, "int4-awq": 1.5, "fp8+lm_head": 0.6}


@pytest.mark.parametrize("fmt", ["fp8", "int4-awq", "fp8+lm_head"])
def test_bench_quant_side_by_side(cli, tiny_ckpt, tmp_path, monkeypatch, fmt):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the temporary quantized folder
    out = tmp_path / "bench.json"
    flags = ("--quant", "fp8", "--quantize-lm-head") if fmt == "fp8+lm_head" else ("--quant", fmt)
    r = cli("bench", tiny_ckpt, *SMALL, "--dtype", "fp32", *flags, "--json", out)
    assert r.code == 0, r.err
    data = json.loads(out.read_text())
    q = data["quant"]
    for key in TIMING_KEYS:
        assert key in data and key in q, key
    for run in (data, q):
        assert run["prefill_ms"] > 0 and run["decode_ms_per_step"] > 0 and run["weights_bytes"] > 0
    assert q["format"] == fmt and q["calibration"]["samples"] == 2 and q["calibration"]["seq_len"] == 16
    # the quantized model's weights: 1/2 (fp8) or ~1/4 (int4) of the quantized Linears' fp32 bytes
    assert q["weights_bytes"] < data["weights_bytes"]
    assert q["parameters"] == data["parameters"]  # quantized weights count in x out parameters
    for key, ratio in q["ratios"].items():
        assert ratio == pytest.approx(q[key] / data[key]), key
    assert set(q["ratios"]) == {"decode_ms_per_step", "prefill_ms", "peak_memory_bytes", "weights_bytes"}
    acc = q["vs_16bit"]
    assert acc["greedy_steps"] == 5
    assert 1e-4 < acc["logits_rel_rms"] < BOUND[fmt], acc
    assert 0 <= acc["greedy_agreement"] <= 1 and acc["greedy_agreement"] * 10 == int(acc["greedy_agreement"] * 10)
    assert f"| gdn-export fp32 |" in r.out and f"| gdn-export {fmt} |" in r.out
    assert r.out.strip().splitlines()[-1].startswith(f"{fmt} vs fp32: last-position logits rel RMS")
    assert not list(tmp_path.glob("gdn-export-bench-quant-*"))  # the temporary folder is gone


@pytest.mark.parametrize("argv, message", [
    (("--quant", "nf4"), "--quant 'nf4' is not one of fp8, int4-awq"),
    (("--quant", "fp8", "--accuracy"), "--accuracy does not combine with --quant"),
    (("--quant", "fp8", "--compare-hf"), "--compare-hf does not combine with --quant"),
    (("--quant", "fp8", "--quant-steps", 0), "--quant-steps must be >= 1, got 0"),
    (("--quant", "int4-awq", "--calib-samples", 0), "--calib-samples must be >= 1, got 0"),
    (("--quant", "int4-awq", "--quantize-lm-head"), "--quantize-lm-head applies to --quant fp8, not int4-awq"),
    (("--quantize-lm-head",), "--quantize-lm-head applies with --quant only"),
], ids=["format", "accuracy", "compare-hf", "steps", "calib-samples", "lm-head-int4", "lm-head-alone"])
def test_bench_quant_user_errors(cli, tiny_ckpt, argv, message):
    r = cli("bench", tiny_ckpt, *argv)
    assert r.error_line("bench").startswith(message)


def test_bench_quant_refuses_a_quantized_checkpoint(cli, tiny_ckpt, tmp_path):
    q = tmp_path / "q8"
    r = cli("quantize", tiny_ckpt, "-o", q, "--format", "fp8", "--calib-samples", 1, "--calib-seq-len", 8, "-q")
    assert r.code == 0, r.err
    r = cli("bench", q, "--quant", "fp8")
    assert "is already quantized" in r.error_line("bench")
