"""benchmarks/spec_bench.py: every batch size covers at least --rows prompts, in sets of its batch,
and the combined row counts all of them (the trained tiny checkpoint: its tokenizer cuts the
prompts from text)."""

from __future__ import annotations

import json

import spec_bench


def test_sets_of_prompts_are_combined(trained_tiny, tmp_path):
    args = ["--batches", "1,2", "--k", "2", "--prompt-len", "16", "--new-tokens", "6", "--rows", "3",
            "--repeats", "1", "--warmup", "0", "--dtype", "fp32", "--device", "cpu", "--out", str(tmp_path)]
    assert spec_bench.main([str(trained_tiny), *args]) == 0
    rows = json.loads((tmp_path / "spec_bench.json").read_text())
    assert [(r["batch"], r["sets"]) for r in rows] == [(1, 3), (2, 2)]
    for r in rows:
        assert len(r["per_set_tokens_per_step"]) == r["sets"]
        assert 1.0 <= r["tokens_per_step"] <= 3.0 and 0.0 <= r["acceptance_rate"] <= 1.0
        # greedy speculative decoding is lossless: every row of every set equals plain decoding
        assert r["rows_equal_plain"] == r["batch"] * r["sets"] and r["tokens_equal_plain"]
        assert abs(r["round_ms"] * r["rounds"] - r["decode_ms"]) < 1e-6 * r["decode_ms"]
    table = (tmp_path / "spec_bench.md").read_text()
    assert "| 1 | 2 |" in table and "3/3 |" in table and "4/4 |" in table
