"""`gdn-export bench` on the CPU with the tiny checkpoint: JSON keys, sane numbers, errors."""

from __future__ import annotations

import json

import pytest

SMALL = ("--batch", 2, "--prompt-len", 9, "--decode-steps", 3, "--warmup", 0, "--repeats", 2, "-q")


def test_bench_writes_sane_json(cli, tiny_ckpt, tmp_path):
    out = tmp_path / "bench.json"
    r = cli("bench", tiny_ckpt, *SMALL, "--dtype", "fp32", "--prefill-chunk", 4, "--json", out)
    assert r.code == 0, r.err
    data = json.loads(out.read_text())
    for key in ("prefill_ms", "decode_ms_per_step", "decode_tokens_per_s", "peak_memory_bytes"):
        assert data[key] > 0, key
    assert data["decode_tokens_per_s"] == pytest.approx(2 / data["decode_ms_per_step"] * 1e3)
    assert len(data["prefill_runs_ms"]) == 2
    assert data["peak_memory_source"] == "process peak RSS"
    assert data["weights_bytes"] > 0 and data["states_bytes"] > 0
    assert (data["op_backend"], data["cuda_graph"], data["prefill_chunk"]) == ("reference", False, 4)
    assert "| gdn-export |" in r.out and "transformers" not in data


def test_bench_accuracy_and_transformers(cli, tiny_ckpt, tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "bench.json"
    r = cli("bench", tiny_ckpt, *SMALL, "--dtype", "bf16", "--accuracy", "--compare-hf", "--json", out)
    assert r.code == 0, r.err
    data = json.loads(out.read_text())
    acc = data["accuracy"]
    assert acc["fp32_fast_tokens_equal_eager"] is True
    # bf16 against fp32: rounding-level but not zero (a comparison of a model with itself would be).
    assert 1e-4 < acc["ours_vs_fp32"]["rel_rms"] < 0.1
    assert 0.5 <= acc["ours_vs_fp32"]["argmax_agreement"] <= 1
    # the GPU runner's default (on the CPU: 4096 tokens a call over the batch, never past the prompt)
    assert data["prefill_chunk"] == min(4096 // data["batch"], data["prompt_len"])
    hf = data["transformers"]
    assert hf["class"] == "Qwen3_5ForCausalLM"
    assert hf["prefill_ms"] > 0 and hf["decode_ms_per_step"] > 0 and hf["peak_memory_bytes"] > 0
    assert hf["accuracy"]["fp32_hf_vs_fp32_ours"]["rel_rms"] < 1e-4  # same fp32 model
    assert 1e-4 < hf["accuracy"]["hf_vs_fp32_hf"]["rel_rms"] < 0.1
    assert "| transformers |" in r.out


@pytest.mark.parametrize("argv, message", [
    (("--batch", 0), "--batch must be >= 1, got 0"),
    (("--prefill-chunk", 0), "--prefill-chunk must be >= 1, got 0"),
    (("--cuda-graph",), "--cuda-graph needs --device cuda"),
    (("--op-backend", "cuda"), "--op-backend cuda needs --device cuda"),
], ids=["batch", "chunk", "graph-on-cpu", "cuda-ops-on-cpu"])
def test_bench_user_errors(cli, tiny_ckpt, argv, message):
    r = cli("bench", tiny_ckpt, *argv)
    assert r.error_line("bench").startswith(message)


def test_bench_missing_checkpoint(cli, tmp_path):
    r = cli("bench", tmp_path / "nope")
    assert "checkpoint folder not found" in r.error_line("bench")


def test_bench_compile_mode_implies_compile(cli, tiny_ckpt, tmp_path, monkeypatch):
    """--compile-mode alone compiles: the runner hands the model to torch.compile with that mode
    (recorded here; inductor's own C++ compile of the tiny model costs minutes of CPU, and the
    compiled runner's results are held by tests/runtime/test_cuda_graph.py and
    tests/runtime/test_quant_compile.py); the JSON and the table say how."""
    import torch

    from gdn_export.runtime import cuda_graph

    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(kw) or model)
    out = tmp_path / "bench.json"
    r = cli("bench", tiny_ckpt, *SMALL, "--dtype", "fp32", "--compile-mode", "max-autotune", "--json", out)
    assert r.code == 0, r.err
    assert calls and all(kw.get("mode") == cuda_graph.COMPILE_MODES["max-autotune"] for kw in calls), calls
    data = json.loads(out.read_text())
    assert (data["compile"], data["compile_mode"]) == (True, "max-autotune")
    assert ", compiled (max-autotune) (medians" in r.out


def test_graph_runner_rejects_an_unknown_compile_mode(tiny_ckpt):
    from gdn_export.errors import InputError
    from gdn_export.runtime.cuda_graph import GraphRunner
    from gdn_export.weights import load_checkpoint

    with pytest.raises(InputError, match="compile mode must be one of"):
        GraphRunner(load_checkpoint(tiny_ckpt), device="cpu", compile=True, compile_mode="fastest")


def test_peak_through_the_runs_keeps_every_phase(monkeypatch):
    """time_runs resets the CUDA peak counter between its phases, so the reported peak (ours and
    transformers') is the largest of: what the counter holds now, the peak before the runs (the
    model's load) and each phase's peak; on the CPU, the process's peak RSS alone."""
    import torch

    from gdn_export.runtime import bench as B

    monkeypatch.setattr(B, "peak_memory", lambda device: (7, "counter"))
    t = B.Timings(batch=1, decode_steps=1, earlier_peak_bytes=30, prefill_peak_bytes=20, decode_peak_bytes=5)
    assert B.peak_memory_through(t, torch.device("cuda")) == (30, "counter")
    t.prefill_peak_bytes = 40
    assert B.peak_memory_through(t, torch.device("cuda")) == (40, "counter")
    assert B.peak_memory_through(B.Timings(1, 1), torch.device("cpu")) == (7, "counter")
