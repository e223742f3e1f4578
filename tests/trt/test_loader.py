"""Finding TensorRT, the plugin library and the environment of the build process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gdn_export.errors import GdnExportError
from gdn_export.trt import loader


def test_find_plugins_explicit_path_beats_env(tmp_path, monkeypatch):
    lib = tmp_path / "libgdn_plugins.so"
    lib.write_bytes(b"\x7fELF")
    other = tmp_path / "other.so"
    other.write_bytes(b"\x7fELF")
    monkeypatch.setenv(loader.PLUGINS_ENV, str(other))
    assert loader.find_plugins(lib) == lib.resolve()
    assert loader.find_plugins() == other.resolve()
    assert loader.find_plugins(tmp_path) == lib.resolve()  # a folder means the library inside it


@pytest.mark.parametrize("how", ["argument", "env", "default"])
def test_missing_plugin_library_is_one_line_error(tmp_path, monkeypatch, how):
    missing = tmp_path / "nowhere" / "libgdn_plugins.so"
    monkeypatch.delenv(loader.PLUGINS_ENV, raising=False)
    if how == "env":
        monkeypatch.setenv(loader.PLUGINS_ENV, str(missing))
    if how == "default":
        monkeypatch.setattr(loader, "DEFAULT_PLUGINS", missing)
    with pytest.raises(GdnExportError) as info:
        loader.find_plugins(missing if how == "argument" else None)
    message = str(info.value)
    assert "\n" not in message and str(missing) in message and "cmake --build" in message


def test_forced_flavour_must_be_known(monkeypatch):
    loader.flavour.cache_clear()
    monkeypatch.setenv(loader.FLAVOUR_ENV, "tensorrt_llm")
    try:
        with pytest.raises(GdnExportError, match="choose one of tensorrt, tensorrt_rtx"):
            loader.flavour()
    finally:
        loader.flavour.cache_clear()


def test_build_env_puts_the_rtx_symlink_first(trt_flavour, tmp_path, monkeypatch):
    monkeypatch.setenv(loader.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/somewhere")
    env = loader.build_env()
    assert env[loader.FLAVOUR_ENV] == trt_flavour
    folder = loader.rtx_symlink_dir()
    if folder is None:
        assert env["LD_LIBRARY_PATH"] == "/opt/somewhere"
        pytest.skip(f"{trt_flavour} needs no libtensorrt_rtx.so symlink")
    link = folder / "libtensorrt_rtx.so"
    assert link.is_symlink() and Path(os.readlink(link)).name.startswith("libtensorrt_rtx.so.")
    assert link.resolve().is_file()
    assert env["LD_LIBRARY_PATH"].split(os.pathsep) == [str(folder), "/opt/somewhere"]
    assert loader.rtx_symlink_dir() == folder  # idempotent


def test_plugin_identities_match_the_op_contract():
    """gdn_export.trt keeps torch out of the build process, so it repeats the plugin identities;
    they must be the contract's (gdn_export/ops/*/__init__.py)."""
    import importlib

    from gdn_export.trt import _worker, inspect

    # importlib: gdn_export.ops re-exports the op functions under the module names.
    gdr = importlib.import_module("gdn_export.ops.gated_delta_rule")
    conv = importlib.import_module("gdn_export.ops.causal_conv1d")
    moe = importlib.import_module("gdn_export.ops.moe")

    want = tuple((m.PLUGIN_NAME, m.PLUGIN_VERSION, m.PLUGIN_NAMESPACE) for m in (gdr, conv, moe))
    assert _worker.GDN_PLUGINS == want
    assert inspect.GDN_PLUGIN_NAMES == tuple(name for name, _, _ in want)


def test_build_process_imports_no_torch():
    """The build's child process (`python -m gdn_export.trt._worker`, one per engine) imports onnx and
    TensorRT, not torch: ~1 s of imports instead of ~2.8 s before every build."""
    import subprocess
    import sys

    probe = "import sys, gdn_export.trt._worker; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "importing gdn_export.trt._worker imports torch"
