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


def _with_metadata(source, target, **props):
    import onnx

    model = onnx.load(str(source), load_external_data=False)
    for key, value in props.items():
        entry = next((p for p in model.metadata_props if p.key == key), None) or model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(target))
    return target


@pytest.mark.parametrize("graph, fragment", [
    ("handmade", "graph.onnx: not a gdn-export export: its metadata has no gdn_export.version; build takes the "
                 ".onnx that `gdn-export export` writes"),
    ("renamed", "graph.onnx: not a gdn-export graph of this release: inputs x, past.0.conv, past.0.recurrent and "
                "output out, where `run` and `validate` need inputs input_ids, past_lengths, seq_lens and output "
                "logits; export the checkpoint again"),
    ("vision", "graph.onnx: the vision graph of a vision-language export; build its language graph (model.onnx)"),
], ids=["foreign", "our-metadata-other-names", "vision-graph"])
def test_foreign_graphs_are_refused_by_name_before_anything(cli, tmp_path, graph, fragment):
    """Before the plugin library is looked for (here it is missing) and before any progress line:
    an engine of such a graph would be refused by `run` and `validate` only after the build."""
    from tests.trt.graphs import make_plugin_graph

    onnx_path = make_plugin_graph(tmp_path / "graph.onnx")
    if graph != "handmade":
        props = {"gdn_export.version": "0.1.0"}
        if graph == "vision":
            props["gdn_export.vlm.role"] = "vision"
        _with_metadata(onnx_path, onnx_path, **props)
    message = cli("build", onnx_path, "-o", tmp_path / "m.engine", "--plugins", tmp_path / "nowhere.so").error_line(
        "build")
    assert message.startswith(f"{tmp_path}/{fragment}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph.onnx"]


def test_a_plugin_library_that_does_not_load_is_the_only_line(cli, tmp_path, tiny_onnx):
    junk = tmp_path / "libgdn_plugins.so"
    junk.write_bytes(b"not a shared library")
    message = cli("build", tiny_onnx, "-o", tmp_path / "m.engine", "--plugins", junk).error_line("build")
    assert message.startswith(f"plugin library {junk} does not load (") and "cmake --build" in message
