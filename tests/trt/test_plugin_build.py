"""What `build` says when the plugin library is missing or does not load: one line, before any
progress line, with the commands that build it here and what to install or pass first
(gdn_export.trt.plugin_build); no TensorRT needed."""

from __future__ import annotations

import _ctypes
import shutil
from pathlib import Path

import pytest

from gdn_export.errors import GdnExportError
from gdn_export.trt import loader, plugin_build


@pytest.fixture
def no_headers(monkeypatch, tmp_path):
    """A machine without TensorRT headers: no variable set, none of cmake's folders holds them."""
    monkeypatch.delenv("TENSORRT_INCLUDE_DIR", raising=False)
    monkeypatch.delenv("TENSORRT_ROOT", raising=False)
    monkeypatch.setattr(plugin_build, "CMAKE_PATHS", (tmp_path / "usr-include",))


def test_headers_found_by_cmake_give_the_plain_commands(monkeypatch, tmp_path):
    include = tmp_path / "trt" / "include"
    include.mkdir(parents=True)
    (include / "NvInferRuntime.h").write_text("")
    monkeypatch.delenv("TENSORRT_INCLUDE_DIR", raising=False)
    monkeypatch.setenv("TENSORRT_ROOT", str(tmp_path / "trt"))
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.chdir(plugin_build.REPO_ROOT)
    assert plugin_build.how_to_build() == (f"build it with `cmake -S plugins -B plugins/build && cmake --build "
                                           f"plugins/build -j` (TensorRT headers: {include})")


def test_headers_only_in_the_environment_variable_are_passed_to_cmake(monkeypatch, tmp_path):
    (tmp_path / "NvInferRuntime.h").write_text("")
    monkeypatch.setenv("TENSORRT_INCLUDE_DIR", str(tmp_path))  # plugins/CMakeLists.txt reads no such variable
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/bin/{tool}")
    assert f"-DTENSORRT_INCLUDE_DIR={tmp_path} && cmake --build" in plugin_build.how_to_build()


def test_missing_headers_say_where_they_were_looked_for_and_how_to_get_them(no_headers, monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/bin/{tool}")
    text = plugin_build.how_to_build()
    assert text.startswith("building it with `cmake -S ") and "needs the TensorRT headers (NvInferRuntime.h)" in text
    assert str(tmp_path / "usr-include") in text and "libnvinfer-dev" in text
    assert "git clone --depth 1 -b " in text and plugin_build.HEADERS_REPO in text
    assert "add -DTENSORRT_INCLUDE_DIR=<that include/ folder> to the first cmake command" in text


def test_missing_tools_are_named_with_what_to_install(no_headers, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    monkeypatch.setattr(plugin_build, "CUDA_NVCC", Path("/nowhere/nvcc"))
    text = plugin_build.how_to_build()
    assert "cmake >= 3.18 (`pip install cmake`)" in text and "nvcc 12.x / 13.x" in text and "headers" in text
    assert "\n" not in text


def test_sources_missing_from_an_installed_package(monkeypatch, tmp_path):
    monkeypatch.setattr(plugin_build, "SOURCES", tmp_path / "plugins")
    assert "its sources (plugins/ of the gdn-export repository) are not beside this installation" in \
        plugin_build.how_to_build()


def test_a_missing_library_names_the_path_and_the_build(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/bin/{tool}")
    with pytest.raises(GdnExportError) as info:
        loader.find_plugins(tmp_path / "libgdn_plugins.so")
    message = str(info.value)
    assert message.startswith(f"plugin library not found: {tmp_path}/libgdn_plugins.so (--plugins); ")
    assert "cmake --build" in message and message.endswith("or pass --plugins PATH / set $GDN_EXPORT_PLUGINS")


def test_a_library_that_does_not_load_is_named_with_the_loaders_reason(tmp_path):
    junk = tmp_path / "libgdn_plugins.so"
    junk.write_bytes(b"not an ELF file at all")
    with pytest.raises(GdnExportError, match=r"plugin library .*libgdn_plugins.so does not load \(.*(invalid ELF|too short)"):
        loader.check_loads(junk)


def test_a_shared_library_without_getcreators_is_not_a_plugin_library():
    with pytest.raises(GdnExportError, match="is not a TensorRT plugin library: it exports no getCreators"):
        loader.check_loads(Path(_ctypes.__file__))


def test_the_built_library_loads(plugins_lib):
    loader.check_loads(Path(plugins_lib))
