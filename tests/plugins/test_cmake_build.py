"""How the test suite finds the TensorRT headers for the plugin build, and that a missing header
folder skips (with the fix in the reason) while a failing cmake stays an error."""

from __future__ import annotations

import shutil

import pytest

from tests.plugins import cmake_build


@pytest.fixture
def no_default_headers(monkeypatch, tmp_path):
    """Neither the repository's ../shared copy nor a system install is visible."""
    monkeypatch.setattr(cmake_build, "SHARED_TRT_HEADERS", tmp_path / "absent-shared")
    monkeypatch.setattr(cmake_build, "SYSTEM_TRT_HEADERS", (tmp_path / "absent-system",))


def _headers(folder):
    folder.mkdir(parents=True)
    (folder / cmake_build.HEADER).write_text("// stand-in\n")
    return folder


def test_include_dir_env_wins_over_root(no_default_headers, tmp_path):
    inc, root = _headers(tmp_path / "inc"), tmp_path / "root"
    _headers(root / "include")
    env = {"TENSORRT_INCLUDE_DIR": str(inc), "TENSORRT_ROOT": str(root)}
    assert cmake_build.find_tensorrt_headers(env) == inc
    assert cmake_build.find_tensorrt_headers({"TENSORRT_ROOT": str(root)}) == root / "include"


def test_env_pointing_nowhere_is_named(no_default_headers, tmp_path):
    reason = cmake_build.find_tensorrt_headers({"TENSORRT_ROOT": str(tmp_path / "nope")})
    assert isinstance(reason, str) and "TENSORRT_ROOT is set" in reason and "nope" in reason


def test_shared_copy_is_the_fallback(no_default_headers, monkeypatch, tmp_path):
    shared = _headers(tmp_path / "shared-inc")
    monkeypatch.setattr(cmake_build, "SHARED_TRT_HEADERS", shared)
    assert cmake_build.find_tensorrt_headers({}) == shared


def test_without_headers_the_reason_names_both_variables(no_default_headers):
    reason = cmake_build.find_tensorrt_headers({})
    assert isinstance(reason, str)
    assert "TENSORRT_INCLUDE_DIR=" in reason and "TENSORRT_ROOT=" in reason


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("nvcc") is None, reason="needs cmake and nvcc")
def test_failing_cmake_is_an_error_not_a_skip(monkeypatch, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text('cmake_minimum_required(VERSION 3.18)\nmessage(FATAL_ERROR "boom")\n')
    monkeypatch.setattr(cmake_build, "PLUGINS_SRC", src)
    monkeypatch.setenv("TENSORRT_INCLUDE_DIR", str(_headers(tmp_path / "inc")))
    monkeypatch.delenv("GDN_TEST_PLUGIN_BUILD", raising=False)
    with pytest.raises(RuntimeError, match="boom"):
        cmake_build._build.__wrapped__()
