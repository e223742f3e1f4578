"""`gdn-export bench --quant` on CUDA (tiny checkpoint): calibration on the GPU (ModelOpt's PyTorch
fake quantization, no extension build), both models on the triton ops with CUDA graphs and
--compile, the JSON keys, ratios and accuracy bounds of the CPU test."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_bench_quant import BOUND, TIMING_KEYS
from tests.conftest import GPU_ONLY

pytestmark = GPU_ONLY
pytest.importorskip("modelopt")


@pytest.mark.parametrize("fmt", ["fp8", "int4-awq"])
def test_bench_quant_cuda_compiled(cli, tiny_ckpt, tmp_path, fmt):
    out = tmp_path / "bench.json"
    r = cli("bench", tiny_ckpt, "--device", "cuda", "--dtype", "bf16", "--cuda-graph", "--compile", "--batch", 2,
            "--prompt-len", 40, "--decode-steps", 4, "--warmup", 1, "--repeats", 2, "-q", "--quant", fmt,
            "--calib-samples", 2, "--calib-seq-len", 32, "--json", out)
    assert r.code == 0, r.err
    data = json.loads(out.read_text())
    q = data["quant"]
    for key in TIMING_KEYS:
        assert key in data and key in q, key
    assert data["cuda_graph"] and data["compile"] and data["op_backend"] == "triton"
    assert q["peak_memory_source"] == "torch.cuda.max_memory_allocated" and q["weights_bytes"] < data["weights_bytes"]
    for key, ratio in q["ratios"].items():
        assert ratio == pytest.approx(q[key] / data[key]), key
    acc = q["vs_16bit"]
    assert acc["greedy_steps"] == 64 and 1e-4 < acc["logits_rel_rms"] < BOUND[fmt], acc
