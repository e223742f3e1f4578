"""Full-model export of tiny checkpoints: file contract, atomic write, ORT vs PyTorch parity."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import onnx
import onnx_ir
import pytest
import torch

from gdn_export import __version__
from gdn_export.config import LINEAR
from gdn_export.errors import GdnExportError
from gdn_export.onnx import export as export_module
from gdn_export.onnx import attach_reference_functions, export_onnx, metadata
from gdn_export.onnx.checks import check_plugin_mappable
from gdn_export.onnx.schemas import register_schemas
from gdn_export.runtime.ort_runner import OrtRunner
from gdn_export.runtime.torch_runner import TorchRunner
from tests.onnx._tiny import FAMILIES, tiny_checkpoint, tiny_export

ATOL = 1e-4
PROMPTS = (1, 63, 130)
DECODE_STEPS = 8


@pytest.fixture(scope="module", params=FAMILIES)
def exported(request, tiny_root):
    model, path = tiny_export(request.param, tiny_root)
    return request.param, model, path


def _dims(value):
    return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in value.type.tensor_type.shape.dim]


def test_file_holds_plugin_nodes_and_no_functions(exported):
    _, model, path = exported
    proto = onnx.load(path)
    n_linear = model.config.layer_kinds.count(LINEAR)
    assert check_plugin_mappable(proto) == {"GatedDeltaRule": n_linear, "CausalConv1d": n_linear}
    assert len(proto.functions) == 0
    assert {e.domain: e.version for e in proto.opset_import} == {"": export_module.ONNX_OPSET, "gdn": 1}
    domains = Counter(n.domain for n in proto.graph.node)
    assert set(domains) == {"", "gdn"}


def test_checker_and_strict_shape_inference(exported):
    _, _, path = exported
    register_schemas()
    onnx.checker.check_model(str(path), full_check=True)
    onnx.shape_inference.infer_shapes(onnx.load(path), check_type=True, strict_mode=True)


def test_attached_functions_are_valid_onnx_and_stay_in_memory(exported):
    _, _, path = exported
    before = path.read_bytes()
    proto = onnx.load(path)
    full = attach_reference_functions(proto)
    assert len(proto.functions) == 0  # the input is not modified
    assert sorted(f.name for f in full.functions) == ["CausalConv1d", "GatedDeltaRule"]
    onnx.checker.check_model(full, full_check=True)
    assert attach_reference_functions(full).functions == full.functions  # idempotent
    assert path.read_bytes() == before


def test_io_names_and_dynamic_axes(exported):
    _, model, path = exported
    proto = onnx.load(path)
    specs = model.state_specs()
    V = model.config.vocab_size
    assert [i.name for i in proto.graph.input] == ["input_ids", "position_ids", *(s.name for s in specs)]
    assert [o.name for o in proto.graph.output] == ["logits", *(s.output_name for s in specs)]
    assert _dims(proto.graph.input[0]) == ["batch", "seq"]
    assert _dims(proto.graph.output[0]) == ["batch", "seq", V]
    for spec, value in zip(specs, proto.graph.input[2:]):
        assert tuple(_dims(value)) == spec.shape, spec.name


# Constants that are not weights (shape vectors, scalars, the zero conv bias [C]).
NON_WEIGHT_BYTES = 4096


def test_initializers_do_not_duplicate_weights(exported):
    """The exporter folds transposes and 1 + w into initializers; each replaces its weight, so the
    file holds no more weight bytes than the model (no transposed second copy)."""
    _, model, path = exported
    proto = onnx.load(path)
    init_bytes = sum(onnx.numpy_helper.to_array(t).nbytes for t in proto.graph.initializer)
    unique = {p.data_ptr(): p.numel() * p.element_size() for p in model.state_dict().values()}
    assert init_bytes <= sum(unique.values()) + NON_WEIGHT_BYTES, (init_bytes, sum(unique.values()))


def test_metadata_records_state_layout(exported):
    family, model, path = exported
    props = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
    assert props[metadata.KEY_VERSION] == __version__
    assert props[metadata.KEY_FAMILY] == family
    assert props[metadata.KEY_DTYPE] == "float32"
    assert props[metadata.KEY_VOCAB] == str(model.config.vocab_size)
    assert metadata.read_state_layouts(props) == metadata.layouts_from_specs(model.state_specs())


@pytest.mark.parametrize("prompt_len", PROMPTS, ids=[f"prompt{t}" for t in PROMPTS])
def test_ort_matches_torch_prefill_and_decode(exported, prompt_len):
    """Batch 2: prefill (P = 0), then 8 decode steps (T = 1) fed the torch model's greedy tokens."""
    _, model, path = exported
    torch_runner, ort_runner = TorchRunner(model), OrtRunner(path)
    ids = np.random.default_rng(prompt_len).integers(0, model.config.vocab_size, (2, prompt_len))
    t_states, o_states = torch_runner.empty_states(2), ort_runner.empty_states(2)
    past = 0
    for step in range(DECODE_STEPS + 1):
        t_logits, t_states = torch_runner.forward(ids, past, t_states)
        o_logits, o_states = ort_runner.forward(ids, past, o_states)
        assert o_logits.shape == t_logits.shape == (2, ids.shape[1], model.config.vocab_size)
        np.testing.assert_allclose(o_logits, t_logits, rtol=0, atol=ATOL, err_msg=f"step {step}")
        past += ids.shape[1]
        ids = t_logits[:, -1].argmax(-1)[:, None].astype(np.int64)
    want = torch_runner.states_to_numpy(t_states)
    got = ort_runner.states_to_numpy(o_states)
    for name, expected in want.items():
        np.testing.assert_allclose(got[name], expected, rtol=0, atol=ATOL, err_msg=name)
    assert got["past.3.key"].shape[2] == prompt_len + DECODE_STEPS


# ------------------------------------------------------------------------- writing the file


@pytest.fixture
def retrace_free(monkeypatch, tiny_root):
    """export_onnx with the tracing replaced by a reload of the qwen3_5 export (saves seconds)."""
    model, path = tiny_export("qwen3_5", tiny_root)
    monkeypatch.setattr(export_module, "_trace", lambda *_args: onnx_ir.load(path))
    return model, path


def test_failure_leaves_nothing_and_keeps_the_old_file(retrace_free, tmp_path, monkeypatch):
    model, _ = retrace_free
    target = tmp_path / "model.onnx"
    target.write_bytes(b"previous export")

    def broken_check(*_args):
        raise RuntimeError("check failed on purpose")

    monkeypatch.setattr(export_module, "_verify", broken_check)
    with pytest.raises(RuntimeError, match="on purpose"):
        export_onnx(model, target)
    assert sorted(os.listdir(tmp_path)) == ["model.onnx"]
    assert target.read_bytes() == b"previous export"


def test_large_model_writes_sidecar_data(retrace_free, tmp_path, monkeypatch):
    model, small_path = retrace_free
    monkeypatch.setattr(export_module, "EXTERNAL_DATA_THRESHOLD", 0)
    target = export_onnx(model, tmp_path / "big.onnx")
    assert sorted(os.listdir(tmp_path)) == ["big.onnx", "big.onnx.data"]
    proto = onnx.load(target, load_external_data=False)
    locations = {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"big.onnx.data"}
    ids = np.arange(10, dtype=np.int64).reshape(2, 5)
    big, small = OrtRunner(target), OrtRunner(small_path)
    np.testing.assert_array_equal(big.forward(ids, 0, big.empty_states(2))[0],
                                  small.forward(ids, 0, small.empty_states(2))[0])
    assert sorted(os.listdir(tmp_path)) == ["big.onnx", "big.onnx.data"]  # no temp copy left
    # Re-exported small under the same name: the old sidecar goes.
    monkeypatch.setattr(export_module, "EXTERNAL_DATA_THRESHOLD", 2**40)
    export_onnx(model, target)
    assert os.listdir(tmp_path) == ["big.onnx"]
    np.testing.assert_array_equal(OrtRunner(target).forward(ids, 0, big.empty_states(2))[0],
                                  small.forward(ids, 0, small.empty_states(2))[0])


@pytest.mark.parametrize("name,opset,message", [
    ("model.txt", 18, "must end in .onnx"),
    ("model.onnx", 17, "outside the range"),
    ("model.onnx", 22, "outside the range"),
    ("missing/model.onnx", 18, "does not exist"),
], ids=["bad-suffix", "opset17", "opset22", "no-folder"])
def test_bad_targets_raise_before_tracing(tiny_root, tmp_path, name, opset, message):
    model, _ = tiny_export("qwen3_5", tiny_root)
    with pytest.raises(GdnExportError, match=message):
        export_onnx(model, tmp_path / name, opset=opset)
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_export(tiny_root, dtype):
    """The graph keeps the model dtype; the recurrent state and g stay fp32 at the gdn nodes."""
    model, path = tiny_export("qwen3_5", tiny_root, dtype)
    proto = onnx.load(path)
    name = str(dtype).removeprefix("torch.")
    elem = {torch.float16: onnx.TensorProto.FLOAT16, torch.bfloat16: onnx.TensorProto.BFLOAT16}[dtype]
    types = {v.name: v.type.tensor_type.elem_type for v in proto.graph.input}
    assert types["past.0.conv"] == types["past.3.key"] == elem
    assert types["past.0.recurrent"] == onnx.TensorProto.FLOAT
    assert {p.key: p.value for p in proto.metadata_props}[metadata.KEY_DTYPE] == name
    check_plugin_mappable(proto)
    if dtype == torch.float16:  # ORT's CPU provider has no bfloat16 kernels to try the other
        fp32_model, _ = tiny_export("qwen3_5", tiny_root)
        ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 9))
        runner, reference = OrtRunner(path), TorchRunner(fp32_model)
        got = runner.forward(ids, 0, runner.empty_states(2))[0]
        want = reference.forward(ids, 0, reference.empty_states(2))[0]
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert rel < 1e-2, rel


def test_tiny_checkpoint_dir_is_reused(tiny_root):
    assert tiny_checkpoint("qwen3_5", tiny_root).is_dir()
