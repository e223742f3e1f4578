"""`gdn-export build` mistakes that end before TensorRT runs (tests/trt builds real engines)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("onnx,args,fragment", [
    ("{tmp}/missing.onnx", ["--plugins", "{tmp}/lib.so"], "missing.onnx: no such ONNX file"),
    ("{onnx}", ["--plugins", "{tmp}/nowhere/libgdn_plugins.so"], "plugin library not found: "),
    ("{onnx}", ["--plugins", "{tmp}"], "plugin library not found: {tmp}/libgdn_plugins.so (--plugins)"),
    ("{onnx}", ["-o", "{tmp}/no/m.engine"], "folder {tmp}/no does not exist"),
    ("{onnx}", ["--workspace", "0"], "--workspace (MiB) must be >= 1, got 0"),
    ("{onnx}", ["--trt-min-shapes", "input_ids[1,1]"],
     "--trt-min-shapes: 'input_ids[1,1]' is not NAME:[d0,d1,...]"),
    ("{onnx}", ["--trt-opt-shapes", "input_ids:[1,x]"],
     "--trt-opt-shapes: 'input_ids:[1,x]' has a dim that is not an integer"),
], ids=["missing-onnx", "missing-plugins", "plugins-folder-without-library", "engine-folder-missing",
        "zero-workspace", "spec-without-colon", "bad-shape-spec"])
def test_mistakes_exit_2(cli, tmp_path, tiny_onnx, onnx, args, fragment):
    fill = lambda s: s.format(tmp=tmp_path, onnx=tiny_onnx)  # noqa: E731
    argv = ["build", fill(onnx), "-o", tmp_path / "m.engine", *map(fill, args)]
    result = cli(*argv)
    assert fill(fragment) in result.error_line("build")
    assert list(tmp_path.iterdir()) == []


def test_plugins_from_the_environment(cli, tmp_path, tiny_onnx, monkeypatch):
    monkeypatch.setenv("GDN_EXPORT_PLUGINS", str(tmp_path / "env-lib.so"))
    message = cli("build", tiny_onnx, "-o", tmp_path / "m.engine").error_line("build")
    assert f"{tmp_path}/env-lib.so ($GDN_EXPORT_PLUGINS)" in message
