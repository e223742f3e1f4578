"""benchmarks/fake_quant.py and quant_accuracy.py: the independent fake quantization computes the
formats as gdn-export's quantized layers define them (same scales -> same numbers), calibrates what
`gdn-export quantize` calibrates (same rows -> same scales and, for FP8, the same weights), its AWQ
search never loses to round-to-nearest, and the accuracy table runs on the tiny trained checkpoint.

Tolerances: FP8 weights and K/V roundings are compared exactly (one e4m3 rounding of the same
fp32 value); static scales from two implementations' fp32 forward passes agree to 1e-5 relative;
one layer's fp32 output to 1e-6 relative RMS (the same products summed in another order); INT4
codes through a pre-scale stored in bf16 agree to >= 99% (the rest on rounding ties, one step off).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import fake_quant as fq
import quant_accuracy as qa
from gdn_export.ops.quant_linear import naive


def _rel(a, b) -> float:
    return float((a.float() - b.float()).pow(2).mean().sqrt() / b.float().pow(2).mean().sqrt())


def test_fp8_layer_matches_gdn_export_op():
    """FakeQuantLinear(fp8_weight(W), s) == gdn::fp8_linear's reference with the same scales."""
    g = torch.Generator().manual_seed(0)
    W = torch.randn(96, 200, generator=g) * torch.rand(96, 1, generator=g)
    x = torch.randn(7, 200, generator=g) * 3
    s = float(x.abs().max()) / 448 * 0.8  # some activations saturate
    ws = W.abs().amax(1) / 448
    ours = naive.fp8_linear(x, naive.e4m3(W / ws[:, None]), ws, torch.tensor(s))
    assert torch.equal(fq.fp8_weight(W), naive.e4m3(W / ws[:, None]).float() * ws[:, None])
    assert _rel(fq.FakeQuantLinear(fq.fp8_weight(W), s)(x), ours) < 1e-6


def test_int4_rtn_matches_gdn_export_packing():
    """int4_rtn's grid is gdn::int4_linear's: codes in [-8, 7] times amax / 7 per group of 128."""
    g = torch.Generator().manual_seed(1)
    W = torch.randn(10, 300, generator=g)  # K = 300: a partial last group
    Wg = torch.nn.functional.pad(W, (0, 84)).reshape(10, 3, 128)
    scale = Wg.abs().amax(-1) / 7
    q = (Wg / scale[..., None]).round().clamp(-8, 7).reshape(10, 384)[:, :300].to(torch.int8)
    ref = naive.dequantize_int4(naive.pack_int4(q), scale, 300, 128)
    assert torch.equal(fq.int4_rtn(W), ref)


def test_awq_search_never_loses_to_rtn():
    g = torch.Generator().manual_seed(2)
    K = 256
    X = torch.randn(512, K, generator=g) * torch.logspace(-1, 1, K)[torch.randperm(K, generator=g)]  # salient channels
    W = torch.randn(64, K, generator=g) * 0.05
    awq, a = fq.awq_weight(W, X, X.abs().mean(0))
    err = lambda Wq: float((X @ Wq.T - X @ W.T).pow(2).mean())  # noqa: E731
    assert a > 0 and err(awq) < 0.8 * err(fq.int4_rtn(W))


def test_fp8_kv_rounding_matches_gdn_export_cache():
    """The fake K/V rounding == gdn-export's FP8 cache write and read (kv_quantize, kv_dequantize)."""
    from gdn_export.ops.attention.kv_fp8 import kv_dequantize, kv_quantize

    k = (torch.randn(2, 2, 9, 32, generator=torch.Generator().manual_seed(3)) * 4).to(torch.bfloat16)
    scale = 0.011
    ours = kv_dequantize(kv_quantize(k, scale), scale, torch.bfloat16)
    assert torch.equal(fq.fp8_activation(k, scale).to(torch.bfloat16), ours)


@pytest.mark.slow
def test_fake_quant_calibrates_what_gdn_export_quantize_calibrates(trained_tiny, tmp_path):
    """Same calibration rows: fp8 weights identical, input and K/V scales to 1e-5, one layer's
    output to 1e-6; int4-awq codes at gdn-export's own pre-scale >= 99% identical (~15 s: ModelOpt)."""
    import transformers

    from gdn_export.modules.kv_cache_fp8 import kv_scales
    from gdn_export.modules.quant_linear import Fp8Linear, Int4Linear
    from gdn_export.ops.quant_linear.naive import unpack_int4
    from gdn_export.weights import load_checkpoint

    args = qa.parse_args([str(trained_tiny), "--calib-samples", "6", "--device", "cpu"])
    d = qa.data(args, transformers.AutoTokenizer.from_pretrained(trained_tiny))
    np.save(tmp_path / "calib.npy", d["calib"])
    hf32 = transformers.AutoModelForCausalLM.from_pretrained(trained_tiny, dtype=torch.float32).eval()
    stats = fq.calibrate(hf32, torch.as_tensor(d["calib"]), 4, 256)

    fp8 = load_checkpoint(qa.quantize(args, tmp_path / "calib.npy", tmp_path / "fp8", "fp8", "--kv-cache", "fp8"))
    layers = {n: m for n, m in fp8.named_modules() if isinstance(m, Fp8Linear)}
    assert set(layers) == set(fq.target_linears(hf32))
    for name, m in layers.items():
        W = hf32.get_submodule(name).weight.detach()
        assert torch.equal(m.weight.float() * m.weight_scale[:, None], fq.fp8_weight(W)), name
        assert float(m.input_scale) == pytest.approx(stats.amax[name] / 448, rel=1e-5), name
    name, m = next(iter(layers.items()))
    x = stats.inputs(name)
    fake = fq.FakeQuantLinear(fq.fp8_weight(hf32.get_submodule(name).weight.detach()), stats.amax[name] / 448)
    assert _rel(fake(x), m(x)) < 1e-6
    for i, (ks, vs) in kv_scales(fp8).items():
        assert (ks, vs) == pytest.approx(fq.kv_scales(stats)[i], rel=1e-5)

    int4 = load_checkpoint(qa.quantize(args, tmp_path / "calib.npy", tmp_path / "int4", "int4-awq"))
    for name, m in int4.named_modules():
        if isinstance(m, Int4Linear):
            W = hf32.get_submodule(name).weight.detach().float() / m.pre_quant_scale.float()[None]
            ref = fq.int4_rtn(W)
            codes = unpack_int4(m.weight, m.in_features).float()
            step = m.weight_scale.float().repeat_interleave(128, 1)[:, :m.in_features]
            fake_codes = (ref / step).round()
            assert float((codes == fake_codes).float().mean()) >= 0.99, name
            assert float((codes - fake_codes).abs().max()) <= 1, name


@pytest.mark.slow
def test_table_runs_on_the_tiny_checkpoint(trained_tiny, tmp_path, capsys):
    """The whole table (~40 s on 2 cores: two ModelOpt calibrations): every format's row, the bf16
    row reproducing train_small's perplexity, small FP8 changes, the JSON beside it."""
    code = qa.main([str(trained_tiny), "--device", "cpu", "--prompts", "3", "--new-tokens", "6",
                    "--calib-samples", "6", "--out", str(tmp_path)])
    assert code == 0
    text = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert set(rows) == {"format", "bf16", "fp8", "int4-awq", "int4-rtn", "kv-fp8", "fp8+kv-fp8", "fp8-lm-head"}
    got = json.loads((tmp_path / "quant_accuracy.json").read_text())
    res = got["results"]
    recorded = json.loads((trained_tiny / "train_small.json").read_text())["heldout"]["ppl"]
    assert res["bf16"]["fake"]["ppl"] == pytest.approx(recorded, rel=1e-6)  # transformers, same windows
    assert res["bf16"]["ours"]["ppl"] == pytest.approx(recorded, rel=1e-2)  # gdn-export's bf16 model
    for fmt in ("fp8", "kv-fp8", "fp8+kv-fp8"):
        assert abs(res[fmt]["ours"]["ppl_change"]) < 5 and abs(res[fmt]["fake"]["ppl_change"]) < 5, fmt
        assert 0 <= res[fmt]["ours"]["next_token"] <= 1
    assert res["int4-rtn"]["ours"] is None and (tmp_path / "quant_accuracy.md").read_text() in text


@pytest.mark.parametrize("argv,message", [
    (["--formats", "fp4"], "'fp4' is not one of"),
    (["--prompt-len", "32"], "must be shorter than the windows"),
    (["--windows", "0"], "--windows must be >= 1"),
    (["--device", "tpu9"], "is not a torch device"),
    (["--device", "cpu", "--op-backend", "triton"], "--op-backend triton needs --device cuda"),
], ids=["format", "prompt-len", "windows", "device", "backend"])
def test_bad_arguments_stop_first(trained_tiny, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        qa.parse_args([str(trained_tiny), *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_other_checkpoints_are_refused(tmp_path, capsys):
    from gdn_export.weights.tiny import make_tiny_checkpoint

    ck = make_tiny_checkpoint(tmp_path / "ck", "qwen3_5")
    with pytest.raises(SystemExit):
        qa.parse_args([str(ck)])
    assert "no tokenizer.json (a folder written by benchmarks/train_small.py is expected)" in capsys.readouterr().err


def test_another_stdlib_is_refused(trained_tiny, tmp_path, capsys):
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(trained_tiny, ck)
    record = json.loads((ck / "train_small.json").read_text())
    record["corpus"]["heldout_digest"] = "0" * 16
    (ck / "train_small.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit):
        qa.parse_args([str(ck)])
    assert "the held-out text would differ" in capsys.readouterr().err
