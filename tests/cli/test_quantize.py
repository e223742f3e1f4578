"""`gdn-export quantize` through the command line: fp8 and int4-awq checkpoints that export,
validate in ONNX Runtime and carry their format in metadata_props (the ort form of the same file
gives what the validated gdn form gives); every bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import json
import os
import re
import stat

import numpy as np
import onnx
import pytest
import torch

from gdn_export.paths import human_size
from gdn_export.quantize.report import DISTANCE_BOUNDS
from gdn_export.weights.tiny import make_tiny_checkpoint
from tests.onnx._tiny import TWO_LAYERS


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("q") / "bf", "qwen3_5", seed=2,
                                hidden_size=192, intermediate_size=320, **TWO_LAYERS)


@pytest.fixture(scope="module")
def ids_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("calib") / "ids.npy"
    np.save(path, np.random.default_rng(0).integers(0, 256, 200))
    return path


@pytest.mark.parametrize("fmt,algo", [("fp8", "FP8"), ("int4-awq", "W4A16_AWQ")])
def test_quantize_export_validate(cli, ckpt, ids_file, tmp_path, fmt, algo):
    out = tmp_path / "q"
    umask = os.umask(0o022)
    try:
        r = cli("quantize", ckpt, "-o", out, "--format", fmt, "--calib-data", ids_file, "--calib-samples", 3,
                "--calib-seq-len", 40)
    finally:
        os.umask(umask)
    assert r.code == 0, r.err
    assert "calibration forward" in r.err  # progress on stderr
    # the usual modes, as every other command writes (mkdtemp and safetensors would give 0700 / 0600)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in out.iterdir()} == {
        "config.json": 0o644, "hf_quant_config.json": 0o644, "model.safetensors": 0o644}
    size = human_size((out / "model.safetensors").stat().st_size)
    assert r.out.startswith(f"wrote {out} (3 files, ") and f"the largest model.safetensors {size})" in r.out
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "modelopt" and qc["quant_algo"] == algo
    assert any(name.endswith("in_proj_a") for name in qc["ignore"]) and "lm_head" in qc["ignore"]
    assert json.loads((out / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == algo
    onnx_path = tmp_path / "q.onnx"
    assert cli("export", out, "-o", onnx_path, "-q").code == 0
    meta = {p.key: p.value for p in onnx.load(str(onnx_path), load_external_data=False).metadata_props}
    assert meta["gdn_export.quantization"] == fmt
    r = cli("validate", out, "--onnx", onnx_path, "--baseline", ckpt, "-q")
    assert r.code == 0, r.out
    *table, verdict, distance = r.out.strip().splitlines()
    # Part 1, the export's parity: fp32's tolerance on every row; only static FP8 activations may
    # round one e4m3 step apart (named on the row), int4-awq's 16-bit activations never.
    rows = [line for line in table if line.startswith("ort ")]
    verdicts = r"(ok|ok \(one e4m3 rounding step\))" if fmt == "fp8" else "ok"
    assert rows and all(re.search(rf"  0\.0001  0\.001  {verdicts}$", row) for row in rows), rows
    assert verdict.startswith("PASS: ")
    # Part 2, the quantization's cost against the 16-bit checkpoint, held to the format's own bound
    bound = DISTANCE_BOUNDS[fmt]
    assert distance.startswith(f"PASS: quantization ({fmt}) vs the 16-bit {ckpt}: logits relative RMS ")
    assert f"(bound {bound:g})" in distance
    r = cli("validate", out, "--onnx", onnx_path, "--baseline", ckpt, "-q", "--quant-tol", 1e-6)
    assert r.code == 1 and r.out.strip().splitlines()[-1].startswith("FAIL: quantization") and "(bound 1e-06)" in r.out
    _ort_form_gives_the_same(onnx_path)


def _ort_form_gives_the_same(onnx_path):
    """The ort form of a validated file (export --onnx-ops ort writes the same rewrite:
    tests/cli/test_onnx_ops.py) against it in ONNX Runtime: ragged prefill, decode, every state, at
    validate's fp32 tolerances (both compute the quantized layers alike)."""
    import shutil

    from gdn_export.onnx.export import rewrite_form
    from gdn_export.runtime.ort_runner import OrtRunner
    from gdn_export.validate.compare import Tolerances, run_parity

    path = onnx_path.with_name(onnx_path.stem + "-ort.onnx")
    shutil.copyfile(onnx_path, path)
    rewrite_form(path, "ort")
    gdn, ort = OrtRunner(onnx_path), OrtRunner(path)
    assert ort.kernels_note.startswith("ort form")
    report = run_parity(gdn, [ort], vocab_size=gdn.vocab_size, tolerances=Tolerances(1e-4, 1e-3), batch=3,
                        prompt_len=20, decode_steps=2)
    assert report.passed, [r for r in report.rows if not r.passed][:3]


def test_quantize_lm_head(cli, ids_file, tmp_path):
    """--quantize-lm-head on a tied checkpoint: the head FP8 in ModelOpt's layout (weight fp8 [V, H],
    weight_scale [V], input_scale []), the embedding table kept 16-bit, config.json untied; the loader
    reads the head back as an Fp8Linear, and the checkpoint exports and validates."""
    from safetensors import safe_open

    from gdn_export.modules.quant_linear import Fp8Linear
    from gdn_export.weights import load_checkpoint

    tied = make_tiny_checkpoint(tmp_path / "tied", "qwen3_5", seed=3, hidden_size=192, intermediate_size=320,
                                tie_word_embeddings=True, **TWO_LAYERS)
    out = tmp_path / "q"
    r = cli("quantize", tied, "-o", out, "--format", "fp8", "--quantize-lm-head", "--calib-data", ids_file,
            "--calib-samples", 2, "--calib-seq-len", 32)
    assert r.code == 0, r.err
    raw = json.loads((out / "config.json").read_text())
    assert not raw.get("tie_word_embeddings", False) and "lm_head" not in raw["quantization_config"]["ignore"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.get_slice("lm_head.weight").get_dtype() == "F8_E4M3"
        assert f.get_tensor("lm_head.weight_scale").shape == (256,) and f.get_tensor("lm_head.input_scale").dim() == 0
        embed = next(k for k in keys if k.endswith("embed_tokens.weight"))
        embed_dtype = f.get_slice(embed).get_dtype()
    with safe_open(str(tied / "model.safetensors"), "pt") as f:
        assert embed_dtype == f.get_slice(embed).get_dtype()  # the source's 16/32-bit table, untouched
    model = load_checkpoint(out, dtype=torch.bfloat16)
    assert isinstance(model.lm_head, Fp8Linear) and model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.lm_head.weight.dtype == torch.float8_e4m3fn
    onnx_path = tmp_path / "q.onnx"
    assert cli("export", out, "-o", onnx_path, "-q").code == 0
    r = cli("validate", out, "--onnx", onnx_path, "--baseline", tied, "-q")
    assert r.code == 0 and "PASS" in r.out, r.out


def test_published_fp8_exports_and_validates(cli, ckpt, tmp_path):
    from tests.weights.fp8_checkpoints import to_published_fp8

    fp8 = tmp_path / "fp8"
    to_published_fp8(ckpt, fp8)
    onnx_path = tmp_path / "fp8.onnx"
    assert cli("export", fp8, "-o", onnx_path, "-q").code == 0
    r = cli("validate", fp8, "--onnx", onnx_path, "-q")
    assert r.code == 0 and "PASS" in r.out and "quantization (fp8-block128)" in r.out
    _ort_form_gives_the_same(onnx_path)


def _text(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    return path


BAD = [
    pytest.param(lambda t, c: ["--format", "int8"], "--format 'int8' is not one of fp8, int4-awq", id="unknown-format"),
    pytest.param(lambda t, c: ["--format", "fp8", "--calib-data", _text(t, "e.txt", "")],
                 "the file is empty", id="empty-calib"),
    pytest.param(lambda t, c: ["--format", "fp8", "--calib-data", _text(t, "ids.txt", "1 2 9999")],
                 "token id 9999 at position 2 is outside the vocabulary [0, 256)", id="oov-ids"),
    pytest.param(lambda t, c: ["--format", "fp8", "--calib-data", _text(t, "t.txt", "Hello world.")],
                 "has no tokenizer", id="text-without-tokenizer"),
    pytest.param(lambda t, c: ["--format", "fp8", "--calib-data", t / "missing.npy"], "file not found",
                 id="missing-calib"),
    pytest.param(lambda t, c: ["--format", "fp8", "--kv-cache", "int8"], "--kv-cache 'int8' is not one of fp8",
                 id="kv-cache-int8"),
    pytest.param(lambda t, c: ["--format", "fp8", "--calib-samples", "0"], "--calib-samples must be >= 1",
                 id="zero-samples"),
    pytest.param(lambda t, c: ["--format", "int4-awq", "--quantize-lm-head"],
                 "--quantize-lm-head applies to --format fp8, not int4-awq", id="lm-head-int4"),
]


@pytest.mark.parametrize("args,message", BAD)
def test_bad_inputs(cli, ckpt, tmp_path, args, message):
    out = tmp_path / "out"
    r = cli("quantize", ckpt, "-o", out, *args(tmp_path, ckpt))
    assert message in r.error_line("quantize")
    assert not out.exists()


def test_already_quantized_and_existing_output(cli, ckpt, tmp_path):
    from tests.weights.fp8_checkpoints import to_published_fp8

    fp8 = tmp_path / "fp8"
    to_published_fp8(ckpt, fp8)
    r = cli("quantize", fp8, "-o", tmp_path / "again", "--format", "fp8")
    assert "is already quantized (quantization_config quant_method 'fp8')" in r.error_line("quantize")
    assert not (tmp_path / "again").exists()
    (tmp_path / "taken").mkdir()
    r = cli("quantize", ckpt, "-o", tmp_path / "taken", "--format", "fp8")
    assert "already exists (give --overwrite" in r.error_line("quantize")
    assert not any((tmp_path / "taken").iterdir())


def test_quantized_export_needs_opset_21(cli, tmp_path, ckpt):
    from tests.weights.fp8_checkpoints import to_published_fp8

    fp8 = tmp_path / "fp8"
    to_published_fp8(ckpt, fp8)
    r = cli("export", fp8, "-o", tmp_path / "x.onnx", "--kv-cache", "concat")
    assert "need opset >= 21, not 18" in r.error_line("export")
    assert not (tmp_path / "x.onnx").exists()
