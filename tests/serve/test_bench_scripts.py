"""benchmarks/serve_bench.py runs end to end on the CPU (--tiny): static batches through
`gdn-export bench`, a `gdn-export serve` child process under concurrent streaming clients, the
table and the JSON (its GPU run is the same code on the 1.66B shape)."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_serve_bench_tiny(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["serve_bench.py", "--tiny", "--concurrency", "1", "3", "--prompt-len", "8",
                                      "--gen-len", "6", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "benchmarks/serve_bench.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert done.value.code == 0, out
    result = json.loads((tmp_path / "serve_bench.json").read_text())
    assert result["serve_exit"] == 0 and [r["clients"] for r in result["rows"]] == [1, 3]
    for row in result["rows"]:
        assert row["errors"] == 0 and row["tokens"] == row["clients"] * 6
        assert row["static_decode_tokens_per_s"] > 0 and row["decode_tokens_per_s"] > 0 and row["ratio"] > 0
        assert 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"] and 0 < row["itl_p50_ms"] <= row["itl_p99_ms"]
    assert "| clients | static decode tok/s | serve decode tok/s | serve / static |" in out
