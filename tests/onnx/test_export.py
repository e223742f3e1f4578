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
from gdn_export.layout import DeployLayout
from gdn_export.runtime.base import generate
from tests.onnx._same import file_digest, machine_paths_in
from tests.onnx._tiny import CONCAT, FAMILIES, TEST_LAYOUT, tiny_checkpoint, tiny_export

ATOL = 1e-4
PROMPTS = (1, 63, 130)
DECODE_STEPS = 8


LAYOUTS = {"inplace": TEST_LAYOUT, "concat": CONCAT}


@pytest.fixture(scope="module", params=[(f, "inplace") for f in FAMILIES] + [(f, "concat") for f in FAMILIES[:2]],
                ids=lambda p: f"{p[0]}-{p[1]}")
def exported(request, tiny_root):
    family, kv = request.param
    model, path = tiny_export(family, tiny_root, layout=LAYOUTS[kv])
    return family, model, path


def _dims(value):
    return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in value.type.tensor_type.shape.dim]


def test_file_holds_plugin_nodes_and_no_functions(exported):
    _, model, path = exported
    proto = onnx.load(path)
    n_linear = model.config.layer_kinds.count(LINEAR)
    n_moe = sum(model.config.is_moe_layer(i) for i in range(len(model.config.layer_kinds)))
    want = {"GatedDeltaRule": n_linear, "CausalConv1d": n_linear, **({"MoE": n_moe} if n_moe else {})}
    assert check_plugin_mappable(proto) == want  # MoE layers are one sparse gdn.MoE node each
    assert len(proto.functions) == 0
    opset = 24 if model.layout.inplace else export_module.ONNX_OPSET
    assert {e.domain: e.version for e in proto.opset_import} == {"": opset, "gdn": 1}
    domains = Counter(n.domain for n in proto.graph.node)
    assert set(domains) == {"", "gdn"}
    ops = Counter(n.op_type for n in proto.graph.node)
    n_attention = len(model.config.layer_kinds) - n_linear
    if model.layout.inplace:  # one cache update per K and V, one fused attention, per layer
        assert (ops["TensorScatter"], ops["Attention"]) == (2 * n_attention, n_attention)
        for node in proto.graph.node:
            if node.op_type == "TensorScatter":
                assert node.input[0].startswith("past.") and node.output[0].startswith("present.")
    else:
        assert (ops["TensorScatter"], ops["Attention"]) == (0, 0) and ops["Softmax"] >= n_attention


def test_checker_and_strict_shape_inference(exported):
    _, _, path = exported
    register_schemas()
    onnx.checker.check_model(str(path), full_check=True)
    onnx.shape_inference.infer_shapes(onnx.load(path), check_type=True, strict_mode=True)


def test_attached_functions_are_valid_onnx_and_stay_in_memory(exported):
    _, _, path = exported
    before = file_digest(path)
    proto = onnx.load(path)
    full = attach_reference_functions(proto)
    assert len(proto.functions) == 0  # the input is not modified
    assert sorted(f.name for f in full.functions) == ["CausalConv1d", "GatedDeltaRule", "GatedDeltaRuleSteps", "MoE"]
    onnx.checker.check_model(full, full_check=True)
    assert attach_reference_functions(full).functions == full.functions  # idempotent
    assert file_digest(path) == before, f"{path} changed"


def test_the_file_names_no_folder_of_this_machine(exported):
    """One checkpoint, one version: the same bytes wherever gdn-export runs (no stack traces)."""
    assert machine_paths_in(exported[2]) == []


def test_io_names_and_dynamic_axes(exported):
    _, model, path = exported
    proto = onnx.load(path)
    specs = model.state_specs()
    V = model.config.vocab_size
    assert [i.name for i in proto.graph.input] == ["input_ids", "past_lengths", "seq_lens",
                                                   *(s.name for s in specs)]
    assert [o.name for o in proto.graph.output] == ["logits", *(s.output_name for s in specs)]
    assert _dims(proto.graph.input[0]) == ["batch", "seq"]
    assert _dims(proto.graph.input[1]) == _dims(proto.graph.input[2]) == ["batch"]
    assert _dims(proto.graph.output[0]) == ["batch", "seq" if model.layout.logits == "all" else 1, V]
    for spec, value in zip(specs, proto.graph.input[3:]):
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
    assert metadata.read_layout(props) == model.layout


# Prompt lengths exercise the gdn ops' chunk edges (every length is held to each op's contract in
# tests/ops), the families and cache layouts the graph's wiring: every export runs one prompt
# (130 crosses two chunk edges), qwen3_5 inplace all three; not the full cross.
PARITY = [(("qwen3_5", "inplace"), t) for t in PROMPTS] + \
    [((f, "inplace"), 130) for f in FAMILIES[1:]] + [(("qwen3_5", "concat"), 63), (("qwen3_next", "concat"), 1)]


@pytest.mark.parametrize("exported,prompt_len", PARITY, indirect=["exported"],
                         ids=[f"{f}-{kv}-prompt{t}" for (f, kv), t in PARITY])
def test_ort_matches_torch_prefill_and_decode(exported, prompt_len):
    """Batch 2 (inplace: ragged rows of prompt_len and 1 tokens): prefill, then 8 decode steps fed
    the torch model's greedy tokens; every step's logits and every final state agree."""
    _, model, path = exported
    torch_runner, ort_runner = TorchRunner(model), OrtRunner(path)
    rng = np.random.default_rng(prompt_len)
    lens = [prompt_len, 1] if model.layout.inplace else [prompt_len] * 2
    prompts = [rng.integers(0, model.config.vocab_size, n) for n in lens]
    a, b = generate(torch_runner, prompts, DECODE_STEPS + 1), generate(ort_runner, prompts, DECODE_STEPS + 1)
    np.testing.assert_array_equal(a.generated, b.generated)
    for step, (t_logits, o_logits) in enumerate(zip(a.step_logits, b.step_logits)):
        np.testing.assert_allclose(o_logits, t_logits, rtol=0, atol=ATOL, err_msg=f"step {step}")
    width = prompt_len if model.layout.logits == "all" else 1
    assert a.step_logits[0].shape == (2, width, model.config.vocab_size)


def test_ort_states_match_torch_after_a_ragged_prefill(tiny_root):
    model, path = tiny_export("qwen3_next", tiny_root)
    torch_runner, ort_runner = TorchRunner(model), OrtRunner(path)
    ids = np.random.default_rng(3).integers(0, model.config.vocab_size, (3, 70))
    lens = np.array([70, 5, 1])
    want = torch_runner.states_to_numpy(torch_runner.forward(ids, 0, torch_runner.empty_states(3), lens)[1])
    got = ort_runner.states_to_numpy(ort_runner.forward(ids, 0, ort_runner.empty_states(3), lens)[1])
    for name, expected in want.items():
        np.testing.assert_allclose(got[name], expected, rtol=0, atol=ATOL, err_msg=name)


def test_ort_updates_the_cache_in_place(tiny_root):
    """IOBinding: each present.*.key / value output is the past.* array itself, written in place."""
    _, path = tiny_export("qwen3_5", tiny_root)
    runner = OrtRunner(path)
    states = runner.empty_states(2)
    _, new = runner.forward(np.ones((2, 4), np.int64), 0, states)
    for spec, old, now in zip(runner.state_specs, states, new):
        if spec.kind in ("key", "value"):
            assert now is old and np.abs(old[:, :, :4]).sum() > 0 and not old[:, :, 4:].any()


@pytest.mark.slow
@pytest.mark.parametrize("sinks,window", [(2, 8), (0, 5)], ids=["sinks2-window8", "window5"])
def test_streaming_export_matches_torch_far_past_the_window(tiny_root, sinks, window):
    layout = DeployLayout.make(sinks=sinks, window=window)
    model, path = tiny_export("qwen3_5", tiny_root, layout=layout)
    prompts = [np.arange(1, 12), np.arange(3, 6)]
    a = generate(TorchRunner(model), prompts, 40)
    b = generate(OrtRunner(path), prompts, 40)
    np.testing.assert_array_equal(a.generated, b.generated)
    for x, y in zip(a.step_logits, b.step_logits):
        np.testing.assert_allclose(y, x, rtol=0, atol=ATOL)


# ------------------------------------------------------------------------- writing the file


@pytest.fixture
def retrace_free(monkeypatch, tiny_root):
    """export_onnx with the tracing replaced by a reload of the qwen3_5 export (saves seconds)."""
    model, path = tiny_export("qwen3_5", tiny_root)
    monkeypatch.setattr(export_module, "_trace", lambda *_args, **_kwargs: onnx_ir.load(path))
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
    ("model.txt", 24, "must end in .onnx"),
    ("model.onnx", 17, "outside the range"),
    ("model.onnx", 25, "outside the range"),
    ("model.onnx", 21, "the inplace kv cache needs opset >= 24"),
    ("missing/model.onnx", 24, "does not exist"),
], ids=["bad-suffix", "opset17", "opset25", "inplace-opset21", "no-folder"])
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
    assert types["past.0.conv"] == types["past.1.key"] == elem
    assert types["past_lengths"] == types["seq_lens"] == onnx.TensorProto.INT64
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
