"""`export --onnx-ops standard`, `--ort-kernels`, ORT on `--device cuda` without onnxruntime-gpu,
and bf16 exports through `validate` (PASS), from the command line."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest

SMALL = ["--batch", "2", "--prompt-len", "9", "--decode-steps", "2"]


@pytest.fixture(scope="module")
def standard_onnx(exported):
    return exported("fp32", "--onnx-ops", "standard")


def test_export_standard_writes_opset27_ops(standard_onnx):
    proto = onnx.load(standard_onnx)
    ops = {(n.domain, n.op_type) for n in proto.graph.node}
    assert ("", "LinearAttention") in ops and ("", "CausalConvWithState") in ops
    assert not any(d == "gdn" for d, _ in ops)
    assert {e.domain: e.version for e in proto.opset_import} == {"": 27}


@pytest.mark.parametrize("kernels", ["auto", "functions"])
def test_validate_standard_file_says_which_kernels(cli, tiny_ckpt, standard_onnx, kernels):
    result = cli("validate", tiny_ckpt, "--onnx", standard_onnx, "--ort-kernels", kernels, *SMALL)
    assert result.code == 0, result.out + result.err
    assert result.out.splitlines()[-1].startswith("PASS: ")
    want = "native ORT kernels" if kernels == "auto" else "function bodies"
    assert f"ort on cpu: {want}" in result.err


def test_run_prints_the_kernel_line_and_both_forms_generate_the_same(cli, tiny_onnx, standard_onnx):
    a = cli("run", tiny_onnx, "--input-ids", "1,2,3", "--input-ids", "4", "--max-new-tokens", "5")
    b = cli("run", standard_onnx, "--input-ids", "1,2,3", "--input-ids", "4", "--max-new-tokens", "5",
            "--ort-kernels", "native")
    assert a.code == b.code == 0 and a.out == b.out
    assert "ort on cpu: native ORT kernels: com.microsoft.LinearAttention" in b.err


def test_ort_on_cuda_without_onnxruntime_gpu_is_one_line(cli, tiny_onnx, tiny_ckpt, monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    line = cli("run", tiny_onnx, "--input-ids", "1,2", "--device", "cuda").error_line("run")
    assert "--device cuda:0 needs onnxruntime-gpu" in line
    line = cli("validate", tiny_ckpt, "--onnx", tiny_onnx, "--ort-device", "cuda", *SMALL).error_line("validate")
    assert "needs onnxruntime-gpu" in line


def test_ort_kernels_on_a_checkpoint_is_refused(cli, tiny_ckpt):
    line = cli("run", tiny_ckpt, "--input-ids", "1", "--ort-kernels", "native").error_line("run")
    assert "--ort-kernels applies to the ort backend only" in line


def test_unknown_onnx_ops_is_refused(cli, tiny_ckpt, tmp_path):
    line = cli("export", tiny_ckpt, "-o", tmp_path / "x.onnx", "--onnx-ops", "trt").error_line("export")
    assert "--onnx-ops" in line and "'trt'" in line
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--dtype", "bf16"], ["--state-dtype", "bf16"]], ids=["bf16", "bf16-state"])
def test_validate_passes_bf16_exports(cli, cli_root, tiny_ckpt, exported, flags):
    from gdn_export.cli.main import main

    if flags == ["--dtype", "bf16"]:
        path = exported("bf16")  # the session's bf16 export (tests/cli/test_export.py checks its dtypes)
    else:
        path = cli_root / f"bf16-{flags[0][2:]}" / "tiny.onnx"
        path.parent.mkdir()
        assert main(["export", str(tiny_ckpt), "-o", str(path), *flags, "-q"]) == 0
    result = cli("validate", tiny_ckpt, "--onnx", path, *SMALL)
    assert result.code == 0, result.out
    assert result.out.splitlines()[-1].startswith("PASS: ") and "rounded to bf16" in result.err


def test_bench_ort_times_a_file(cli, tiny_onnx, tmp_path):
    result = cli("bench", "--runtime", "ort", "--onnx", tiny_onnx, "--prompt-len", "8", "--decode-steps", "2",
                 "--repeats", "1", "--warmup", "0", "--json", tmp_path / "b.json")
    assert result.code == 0, result.err
    assert "| tiny.onnx |" in result.out and "ort on cpu: native ORT kernels" in result.err
    import json

    r = json.loads((tmp_path / "b.json").read_text())
    assert r["kernels"] == "native" and r["prefill_ms"] > 0 and r["decode_ms_per_step"] > 0


@pytest.mark.parametrize("args,fragment", [
    (["--runtime", "ort"], "--runtime ort needs --onnx"),
    (["--runtime", "ort", "--onnx", "{onnx}", "--accuracy"], "--accuracy applies to --runtime torch only"),
    (["--runtime", "ort", "--onnx", "{onnx}", "--device", "cuda"], "--device cuda:0 needs onnxruntime-gpu"),
    (["{ckpt}", "--onnx", "{onnx}"], "--onnx / --ort-kernels apply to --runtime ort"),
], ids=["no-onnx", "torch-flag", "cuda-without-gpu-ort", "onnx-with-torch"])
def test_bench_ort_mistakes(cli, tiny_onnx, tiny_ckpt, monkeypatch, args, fragment):
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    argv = [a.format(onnx=tiny_onnx, ckpt=tiny_ckpt) for a in args]
    assert fragment in cli("bench", *argv).error_line("bench")


# ------------------------------------------------------------------------------------ the ort form


@pytest.fixture(scope="module")
def ort_onnx(exported):
    return exported("fp32", "--onnx-ops", "ort")


def test_export_ort_is_the_rewritten_gdn_export(ort_onnx, tiny_onnx, tmp_path):
    """export --onnx-ops ort traces once and writes what rewriting its own gdn export gives, byte for
    byte: tests/onnx/test_ort_form.py takes the rewritten files (tests/onnx/_tiny.py: tiny_ort)."""
    import shutil

    from gdn_export.onnx.export import rewrite_form

    copy = tmp_path / "tiny.onnx"
    shutil.copyfile(tiny_onnx, copy)
    rewrite_form(copy, "ort")
    assert copy.read_bytes() == ort_onnx.read_bytes()
    ops = {(n.domain, n.op_type) for n in onnx.load(ort_onnx).graph.node}
    assert ("com.microsoft", "GatedDeltaNet") in ops and not any(d == "gdn" for d, _ in ops)


def test_validate_and_run_the_ort_form(cli, tiny_ckpt, tiny_onnx, ort_onnx):
    result = cli("validate", tiny_ckpt, "--onnx", ort_onnx, *SMALL)
    assert result.code == 0 and result.out.splitlines()[-1].startswith("PASS: "), result.out + result.err
    assert "ort on cpu: ort form: native ORT kernels com.microsoft.GatedDeltaNet" in result.err
    a = cli("run", tiny_onnx, "--input-ids", "1,2,3", "--input-ids", "4", "--max-new-tokens", "5")
    b = cli("run", ort_onnx, "--input-ids", "1,2,3", "--input-ids", "4", "--max-new-tokens", "5")
    assert a.code == b.code == 0 and a.out == b.out


def test_an_ort_lacking_the_kernels_is_named_before_any_loading(cli, tiny_ckpt, ort_onnx, monkeypatch):
    from gdn_export.onnx import ort_native

    monkeypatch.setattr(ort_native, "missing_native_kernels", lambda provider, ops=(): list(ops))
    for command, argv in (("validate", (tiny_ckpt, "--onnx", ort_onnx, *SMALL)),
                          ("run", (ort_onnx, "--input-ids", "1,2")),
                          ("bench", ("--runtime", "ort", "--onnx", ort_onnx, "--prompt-len", "4"))):
        line = cli(command, *argv).error_line(command)
        assert f"{ort_onnx}: the file is the ort form" in line
        assert (f"onnxruntime {ort.__version__} has no CPUExecutionProvider kernel for "
                "com.microsoft.GatedDeltaNet") in line
        assert "it needs onnxruntime >= 1.32" in line


def test_function_bodies_and_tensorrt_refuse_the_ort_form(cli, ort_onnx, tmp_path):
    line = cli("run", ort_onnx, "--input-ids", "1", "--ort-kernels", "functions").error_line("run")
    assert "--ort-kernels functions: the file is the ort form" in line
    line = cli("build", ort_onnx, "-o", tmp_path / "x.engine").error_line("build")
    assert f"{ort_onnx} is the ort form" in line and "TensorRT has no such ops" in line
    assert "--onnx-ops gdn" in line and not list(tmp_path.iterdir())


def test_bench_ort_times_the_ort_form(cli, ort_onnx):
    result = cli("bench", "--runtime", "ort", "--onnx", ort_onnx, "--prompt-len", "8", "--decode-steps", "2",
                 "--repeats", "1", "--warmup", "0")
    assert result.code == 0, result.err
    assert "| tiny.onnx |" in result.out and "ort form: native ORT kernels" in result.err
