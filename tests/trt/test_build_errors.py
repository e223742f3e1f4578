"""User mistakes around engine building end in one-line GdnExportErrors naming the problem."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from gdn_export.errors import GdnExportError
from gdn_export.trt import build_engine
from tests.trt.graphs import NAME_GDR, make_plugin_graph


def _one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


def test_missing_plugin_library(tmp_path):
    onnx_path = make_plugin_graph(tmp_path / "graph.onnx")
    with pytest.raises(GdnExportError) as info:
        build_engine(onnx_path, tmp_path / "graph.engine", plugins=tmp_path / "libgdn_plugins.so")
    assert "plugin library not found" in _one_line(info)
    assert not (tmp_path / "graph.engine").exists()


def test_creator_not_found_names_name_version_namespace(plugins_lib, tmp_path):
    onnx_path = make_plugin_graph(tmp_path / "graph.onnx", gdr_version="9")
    with pytest.raises(GdnExportError) as info:
        build_engine(onnx_path, tmp_path / "graph.engine", plugins=plugins_lib)
    message = _one_line(info)
    assert f"node '{NAME_GDR}'" in message and "GatedDeltaRule version '9' namespace 'gdn'" in message
    assert "GatedDeltaRule v1 (gdn)" in message  # what the library does provide
    assert not list(tmp_path.glob("*.engine*")) and not list(tmp_path.glob(".*"))


def test_parser_error_names_the_node(plugins_lib, tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    nodes = [helper.make_node("Relu", ["x"], ["t"], name="fine_relu"),
             helper.make_node("Reshape", ["t"], ["y"], name="reshape_without_shape")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, tmp_path / "bad.onnx")
    with pytest.raises(GdnExportError) as info:
        build_engine(tmp_path / "bad.onnx", tmp_path / "bad.engine", plugins=plugins_lib)
    message = _one_line(info)
    assert "ONNX parser rejected" in message and "node 'reshape_without_shape' (Reshape)" in message


def test_not_an_onnx_file(plugins_lib, tmp_path):
    (tmp_path / "junk.onnx").write_bytes(b"not protobuf at all \xff\xfe")
    with pytest.raises(GdnExportError, match="not a readable ONNX file"):
        build_engine(tmp_path / "junk.onnx", tmp_path / "junk.engine", plugins=plugins_lib)


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_shapes="x:[4,128,31]"), "dim 2 is static \\(32\\)"),
    (dict(min_shapes="y:[1,1,32]"), "names y, which the ONNX does not have"),
    (dict(workspace=0), "workspace must be a positive number"),
], ids=["static-dim", "unknown-input", "workspace"])
def test_bad_build_options(plugins_lib, tmp_path, kwargs, match):
    onnx_path = make_plugin_graph(tmp_path / "graph.onnx")
    with pytest.raises(GdnExportError, match=match):
        build_engine(onnx_path, tmp_path / "graph.engine", plugins=plugins_lib, **kwargs)


def test_missing_onnx_and_output_folder(tmp_path):
    with pytest.raises(GdnExportError, match="no such ONNX file"):
        build_engine(tmp_path / "none.onnx", tmp_path / "x.engine")
    onnx_path = make_plugin_graph(tmp_path / "graph.onnx")
    with pytest.raises(GdnExportError, match="output folder does not exist"):
        build_engine(onnx_path, tmp_path / "no" / "x.engine")


def test_an_engine_that_appeared_during_the_build_is_kept(plugins_lib, tmp_path, monkeypatch):
    """Two builds to one engine: the second to finish (overwrite False, as `build` without
    --overwrite) keeps the first one's engine and build record and leaves nothing of its own."""
    import gdn_export.trt.build as build_module
    from gdn_export.trt.build import layers_path

    onnx_path = make_plugin_graph(tmp_path / "graph.onnx")
    engine = tmp_path / "graph.engine"
    real = build_module.publish_files

    def racing(moves, **kwargs):
        engine.write_bytes(b"the other build's engine")
        layers_path(engine).write_text("{}")
        return real(moves, **kwargs)

    monkeypatch.setattr(build_module, "publish_files", racing)
    with pytest.raises(GdnExportError) as info:
        build_engine(onnx_path, engine, plugins=plugins_lib, overwrite=False)
    assert f"{engine} appeared while this command ran" in _one_line(info)
    assert engine.read_bytes() == b"the other build's engine" and layers_path(engine).read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph.engine", "graph.engine.layers.json", "graph.onnx"]
