"""`gdn-export export`: each dtype, and every broken input ends in one line with nothing written."""

from __future__ import annotations

import json
import os
import shutil
import stat

import onnx
import pytest
from safetensors.torch import load_file, save_file

import gdn_export.onnx.export as export_module
from gdn_export.errors import GdnExportError

ONNX_DTYPES = {"fp32": onnx.TensorProto.FLOAT, "fp16": onnx.TensorProto.FLOAT16,
               "bf16": onnx.TensorProto.BFLOAT16}
METADATA_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_export_carries_the_dtype(exported, dtype):
    path = exported(dtype)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temp, no sidecar
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # written under umask 022 (the fixture)
    model = onnx.load(str(path))
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["gdn_export.dtype"] == METADATA_DTYPES[dtype]
    inputs = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
    assert inputs["input_ids"] == onnx.TensorProto.INT64
    # conv and key / value caches follow the model dtype; the recurrent state stays fp32.
    assert inputs["past.0.conv"] == ONNX_DTYPES[dtype]
    assert inputs["past.1.key"] == ONNX_DTYPES[dtype]
    assert inputs["past.0.recurrent"] == onnx.TensorProto.FLOAT
    weights = [t for t in model.graph.initializer if len(t.dims) == 2 and min(t.dims) > 1]
    assert weights and all(t.data_type == ONNX_DTYPES[dtype] for t in weights)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _unsupported_model_type(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    config["model_type"] = "llama"
    (ckpt / "config.json").write_text(json.dumps(config))


def _truncated_header(ckpt):
    path = ckpt / "model.safetensors"
    path.write_bytes(path.read_bytes()[:1000])


def _truncated_data(ckpt):
    path = ckpt / "model.safetensors"
    os.truncate(path, path.stat().st_size - 100)


def _misshaped(ckpt):
    tensors = load_file(ckpt / "model.safetensors")
    tensors["model.layers.0.linear_attn.A_log"] = tensors["model.layers.0.linear_attn.A_log"][:3]
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})


BROKEN = {
    "unsupported-model-type": (_unsupported_model_type, ["model_type 'llama' is not supported"]),
    "truncated-header": (_truncated_header, ["model.safetensors: not a readable safetensors file"]),
    "truncated-data": (_truncated_data, ["model.safetensors: not a readable safetensors file"]),
    "misshaped-tensor": (_misshaped, ["tensor model.layers.0.linear_attn.A_log", "(3,)", "(4,)"]),
}


@pytest.mark.parametrize("case", BROKEN)
def test_broken_checkpoint(cli, tmp_path, tiny_ckpt, case):
    damage, fragments = BROKEN[case]
    ckpt = _copy(tiny_ckpt, tmp_path / "ckpt")
    damage(ckpt)
    out = tmp_path / "out"
    out.mkdir()
    message = cli("export", ckpt, "-o", out / "m.onnx", "-q").error_line("export")
    assert all(f in message for f in fragments), message
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("output,args,fragment", [
    ("no-such-folder/m.onnx", [], "folder {tmp}/no-such-folder does not exist"),
    ("a-folder.onnx", [], "a-folder.onnx: is a folder"),
    ("m.txt", [], "must end in .onnx"),
    ("m.onnx", ["--opset", "13"], "opset 13 is outside the range gdn-export writes"),
], ids=["folder-missing", "output-is-a-folder", "not-onnx-suffix", "opset-too-old"])
def test_bad_output_fails_before_loading(cli, tmp_path, tiny_ckpt, output, args, fragment):
    (tmp_path / "a-folder.onnx").mkdir()
    result = cli("export", tiny_ckpt, "-o", tmp_path / output, *args)  # no -q: still one line
    assert fragment.format(tmp=tmp_path) in result.error_line("export")
    assert [p.name for p in tmp_path.iterdir()] == ["a-folder.onnx"]


def test_missing_checkpoint_folder(cli, tmp_path):
    message = cli("export", tmp_path / "nope", "-o", tmp_path / "m.onnx").error_line("export")
    assert f"{tmp_path / 'nope'}: checkpoint folder not found" == message
    assert list(tmp_path.iterdir()) == []


def test_late_failure_leaves_the_old_file_and_no_temp(cli, tmp_path, tiny_ckpt, tiny_onnx, monkeypatch):
    """A failure after tracing (here: the checker) must not touch an existing file of that name. The
    trace gives the session's export of the same checkpoint (the trace is not what is tested)."""
    import onnx_ir

    def reject(path, external):
        assert path.exists() and path.parent != tmp_path  # checked in a temp folder, not in place
        raise GdnExportError("injected checker failure")

    monkeypatch.setattr(export_module, "_trace", lambda model, specs, opset, **_: onnx_ir.load(tiny_onnx))
    monkeypatch.setattr(export_module, "_verify", reject)
    (tmp_path / "m.onnx").write_bytes(b"the previous export")
    message = cli("export", tiny_ckpt, "-o", tmp_path / "m.onnx", "-q", "--overwrite").error_line("export")
    assert message == "injected checker failure"
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
    assert (tmp_path / "m.onnx").read_bytes() == b"the previous export"


def test_config_json_not_utf8(cli, tmp_path, tiny_ckpt):
    ckpt = _copy(tiny_ckpt, tmp_path / "ckpt")
    (ckpt / "config.json").write_bytes(b"\xff\xfe{}")
    message = cli("export", ckpt, "-o", tmp_path / "m.onnx", "-q").error_line("export")
    assert message.startswith(f"{ckpt / 'config.json'}: not UTF-8 text (byte 0xff at offset 0)"), message
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("name,opset,fragment", [
    ("m.onnx", 17, "opset 17 is outside the range gdn-export writes and TensorRT parses [18, "),
    ("m.onnx", True, "opset True is outside"),
    ("m.onnx", 18, "opset 18 has no TensorScatter: the inplace kv cache needs opset >= 24"),
    ("m.onnx.txt", 24, "m.onnx.txt: the output file name must end in .onnx"),
    ("gone/m.onnx", 24, "m.onnx: folder {tmp}/gone does not exist"),
    ("dir.onnx", 24, "dir.onnx: is a folder"),
], ids=["opset17", "bool-opset", "inplace-opset18", "suffix", "no-folder", "is-a-folder"])
def test_check_export_target_is_the_check_the_cli_uses(tmp_path, name, opset, fragment):
    """The public library check (the CLI calls it before loading the checkpoint)."""
    from gdn_export.errors import GdnExportError
    from gdn_export.onnx.export import check_export_target

    (tmp_path / "dir.onnx").mkdir()
    with pytest.raises(GdnExportError) as info:
        check_export_target(tmp_path / name, opset)
    assert fragment.format(tmp=tmp_path) in str(info.value)
    assert check_export_target(tmp_path / "ok.onnx") == tmp_path / "ok.onnx"


def _moe_missing_expert(ckpt):
    tensors = load_file(ckpt / "model.safetensors")
    del tensors["model.layers.2.mlp.experts.1.down_proj.weight"]
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})


def _moe_router_rows(ckpt):
    tensors = load_file(ckpt / "model.safetensors")
    tensors["model.layers.0.mlp.gate.weight"] = tensors["model.layers.0.mlp.gate.weight"][:3]
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})


def _moe_top_k(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    config["num_experts_per_tok"] = 9
    (ckpt / "config.json").write_text(json.dumps(config))


MOE_BROKEN = {
    "missing-expert": (_moe_missing_expert, ["tensor model.layers.2.mlp.experts.1.down_proj.weight is missing"]),
    "router-rows": (_moe_router_rows, ["router model.layers.0.mlp.gate.weight has 3 rows", "num_experts is 4"]),
    "top-k-over-experts": (_moe_top_k, ["num_experts_per_tok must be in [1, num_experts=4], got 9"]),
}


@pytest.mark.parametrize("case", MOE_BROKEN)
def test_broken_moe_checkpoint(cli, tmp_path, case):
    damage, fragments = MOE_BROKEN[case]
    assert cli("make-tiny", tmp_path / "ckpt", "--family", "qwen3_5_moe").code == 0
    damage(tmp_path / "ckpt")
    out = tmp_path / "out"
    out.mkdir()
    message = cli("export", tmp_path / "ckpt", "-o", out / "m.onnx", "-q").error_line("export")
    assert all(f in message for f in fragments), message
    assert list(out.iterdir()) == []


class _Traced(Exception):
    pass


def test_whole_trace_flag_reaches_the_export(cli, tiny_ckpt, tmp_path, monkeypatch):
    """`--whole-trace` traces every layer; without it the export stamps (tests/onnx/test_stamp.py)."""
    got = []

    def fake_trace(model, specs, opset, *, whole=False, say=None):
        got.append(whole)
        raise _Traced

    monkeypatch.setattr(export_module, "_trace", fake_trace)
    for flags in ([], ["--whole-trace"]):
        with pytest.raises(_Traced):
            cli("export", tiny_ckpt, "-o", tmp_path / "m.onnx", "--overwrite", *flags)
    assert got == [False, True]
