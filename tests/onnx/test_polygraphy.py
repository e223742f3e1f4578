"""Polygraphy on our files: `polygraphy inspect model` on the three forms, and `polygraphy run --onnxrt`
on the model ONNX Runtime runs (`python -m gdn_export.onnx.ort_native IN OUT`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.onnx._tiny import tiny_export, tiny_ort

POLYGRAPHY = shutil.which("polygraphy") or str(Path(sys.executable).parent / "polygraphy")


def _run(*args, timeout=300):
    if not Path(POLYGRAPHY).exists() and args[0] == POLYGRAPHY:
        pytest.skip("polygraphy is not installed (pip install polygraphy)")
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def files(tiny_root):
    model, gdn = tiny_export("qwen3_5", tiny_root)
    _, std = tiny_export("qwen3_5", tiny_root, onnx_ops="standard")
    _, ort_form = tiny_ort("qwen3_5", tiny_root)
    return model, {"gdn": gdn, "standard": std, "ort": ort_form}


def test_inspect_model_reads_the_three_forms(files):
    _, paths = files
    for form, opsets in (("gdn", "ONNX Opset: 24 | Other Opsets: {'gdn': 1}"), ("standard", "ONNX Opset: 27"),
                         ("ort", "ONNX Opset: 24 | Other Opsets: {'com.microsoft': 1}")):
        path = paths[form]
        result = _run(POLYGRAPHY, "inspect", "model", path)
        assert result.returncode == 0, result.stderr[-2000:]
        assert opsets in result.stdout and "past.0.recurrent" in result.stdout


def _shapes(model):
    specs = model.state_specs()
    shapes = ["input_ids:[1,4]", "past_lengths:[1]", "seq_lens:[1]"]
    shapes += [f"{s.name}:[{','.join(map(str, s.concrete_shape(1, 0)))}]" for s in specs]
    return shapes


@pytest.mark.slow
@pytest.mark.parametrize("form", ["gdn", "standard", "ort"])
def test_polygraphy_run_onnxrt_on_the_ort_model(files, tmp_path, form):
    model, paths = files
    ort_model = tmp_path / "ort.onnx"
    made = _run(sys.executable, "-m", "gdn_export.onnx.ort_native", paths[form], ort_model)
    assert made.returncode == 0 and "native ORT kernels" in made.stdout, made.stderr
    result = _run(POLYGRAPHY, "run", ort_model, "--onnxrt", "--input-shapes", *_shapes(model),
                  "--val-range", f"input_ids:[0,{model.config.vocab_size - 1}]", "past_lengths:[0,0]",
                  "seq_lens:[4,4]")
    assert result.returncode == 0 and "PASSED" in result.stdout + result.stderr, result.stderr[-2000:]


def test_the_bare_file_names_what_ort_lacks(files, tmp_path):
    """The exported gdn file alone is not an ORT model (that is what ort_native writes)."""
    result = _run(sys.executable, "-m", "gdn_export.onnx.ort_native", tmp_path / "missing.onnx", tmp_path / "o.onnx")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "ort_native: error:" in result.stderr
