"""The ort form (`export_onnx(..., onnx_ops="ort")`, gdn_export.onnx.ort_form) of every family: the
file (one com.microsoft GatedDeltaNet / VarlenCausalConvWithState / GatedRMSNorm per GDN layer, the
gates inside, same I/O as the gdn form), ONNX Runtime's CPU kernels against the PyTorch model
(ragged rows, decode, streaming, the concat layout, fp16 / bf16 models and state dtypes, device
buffers), and the refusals (ORT without the kernels, function bodies). The tests take the rewrite of
the shared gdn exports (tiny_ort); tests/cli/test_onnx_ops.py checks export --onnx-ops ort writes
the same file."""

from __future__ import annotations

from collections import Counter

import onnx
import pytest
import torch

from gdn_export.config import LINEAR
from gdn_export.errors import InputError
from gdn_export.layout import DeployLayout
from gdn_export.onnx import forms, ort_native
from gdn_export.runtime.ort_runner import OrtRunner
from gdn_export.runtime.torch_runner import TorchRunner
from tests.onnx._parity import assert_parity
from tests.onnx._tiny import CONCAT, FAMILIES, tiny_export, tiny_ort

MS = "com.microsoft"


@pytest.fixture(scope="module", params=FAMILIES)
def both(request, tiny_root):
    model, gdn_path = tiny_export(request.param, tiny_root)
    _, ort_path = tiny_ort(request.param, tiny_root)
    return request.param, model, gdn_path, ort_path


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def test_ort_file_has_one_fused_op_per_layer_and_the_gdn_io(both):
    family, model, gdn_path, ort_path = both
    gdn, ort = onnx.load(gdn_path), onnx.load(ort_path)
    n_linear = model.config.layer_kinds.count(LINEAR)
    ops = Counter((n.domain, n.op_type) for n in ort.graph.node)
    assert ops[(MS, "GatedDeltaNet")] == ops[(MS, "VarlenCausalConvWithState")] == ops[(MS, "GatedRMSNorm")] == n_linear
    assert ops[("gdn", "GatedDeltaRule")] == ops[("gdn", "CausalConv1d")] == 0
    assert ops[("", "Softplus")] == 0  # the gate went into GatedDeltaNet
    has_moe = ops[("gdn", "MoE")] > 0
    assert {e.domain: e.version for e in ort.opset_import} == {"": 24, MS: 1, **({"gdn": 1} if has_moe else {})}
    olmo = family == "olmo_hybrid"  # beta = 2 sigmoid(b): no attribute says so, it stays outside
    for node in ort.graph.node:
        if node.op_type == "GatedDeltaNet":
            a = _attrs(node)
            assert a["gate_activation"] == b"qwen" and a.get("qk_l2_norm", 0) == 0
            assert a.get("beta_activation", b"none") == (b"none" if olmo else b"sigmoid")
            assert a["scale"] == pytest.approx(model.config.linear_key_head_dim ** -0.5)
            assert len(node.input) == 9 and node.input[3] == ""  # a_log, dt_bias; no cu_seqlens
    assert ort.graph.input == gdn.graph.input and ort.graph.output == gdn.graph.output
    props = {p.key: p.value for p in ort.metadata_props}
    gdn_props = {p.key: p.value for p in gdn.metadata_props}
    assert props.pop(forms.KEY_ONNX_OPS) == "ort" and props == gdn_props
    assert forms.form_of(ort) == "ort" and forms.form_of(gdn) == "gdn"
    onnx.checker.check_model(str(ort_path), full_check=True)
    onnx.shape_inference.infer_shapes(ort, check_type=True, strict_mode=True)


def test_ort_form_matches_torch(both):
    """Ragged prefill of 65 / 33 / 1 tokens, then 4 forced decode steps; every logits and state row."""
    _, model, _, ort_path = both
    runner = OrtRunner(ort_path)
    assert runner.kernels == "native" and runner.kernels_note.startswith("ort form: native ORT kernels")
    assert_parity(TorchRunner(model), [runner])


def test_device_buffers_path(tiny_root):
    """The IOBinding path of --device cuda (states as OrtValues, GDN states swapped with a spare
    buffer), here on the CPU provider."""
    model, ort_path = tiny_ort("qwen3_5", tiny_root)
    assert_parity(TorchRunner(model), [OrtRunner(ort_path, device_buffers=True)], prompt_len=20, steps=3, batch=2)


@pytest.mark.slow
def test_ort_form_long_prompt(tiny_root):
    model, ort_path = tiny_ort("qwen3_5", tiny_root)
    assert_parity(TorchRunner(model), [OrtRunner(ort_path)], prompt_len=130, steps=2, batch=2)


@pytest.mark.slow
def test_ort_form_streams_far_past_the_window(tiny_root):
    layout = DeployLayout.make(sinks=2, window=8)
    model, ort_path = tiny_ort("qwen3_5", tiny_root, layout=layout)
    assert_parity(TorchRunner(model), [OrtRunner(ort_path)], prompt_len=11, steps=30, batch=2)


@pytest.mark.slow
def test_ort_form_concat_layout(tiny_root):
    model, ort_path = tiny_ort("qwen3_next", tiny_root, layout=CONCAT)
    assert_parity(TorchRunner(model), [OrtRunner(ort_path)], prompt_len=20, steps=3, batch=2)


# The exports other suites make already (tests/onnx/test_standard_export.py, test_bf16_emulation.py,
# test_export.py): (model dtype, state dtype).
DTYPES = {"fp16-fp16state": (torch.float16, "float16"), "bf16": (torch.bfloat16, "float32"),
          "fp32-bf16state": (torch.float32, "bfloat16")}


@pytest.mark.slow
@pytest.mark.parametrize("dtype,state", DTYPES.values(), ids=list(DTYPES))
def test_ort_form_dtypes_and_state_dtypes(tiny_root, dtype, state):
    """The torch model of the same dtype is the reference; tolerances are validate's defaults."""
    layout = DeployLayout.make(cache_len=160, state_dtype=state)
    model, gdn_path = tiny_export("qwen3_5", tiny_root, dtype=dtype, layout=layout)
    _, ort_path = tiny_ort("qwen3_5", tiny_root, dtype=dtype, layout=layout)
    runner = OrtRunner(ort_path)
    specs = lambda r: [(s.name, s.dtype) for s in r.state_specs]  # noqa: E731
    assert specs(runner) == specs(OrtRunner(gdn_path))
    assert_parity(TorchRunner(model), [runner], dtype=str(dtype).removeprefix("torch."), state=state,
            prompt_len=40, steps=3, batch=2)


def test_ort_without_the_kernels_is_refused_by_name_at_load(tiny_root, monkeypatch):
    _, ort_path = tiny_ort("qwen3_5", tiny_root)
    monkeypatch.setattr(ort_native, "missing_native_kernels", lambda provider, ops=(): list(ops))
    with pytest.raises(InputError) as err:
        OrtRunner(ort_path)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{ort_path}: the file is the ort form")
    assert "com.microsoft.GatedDeltaNet" in line and "needs onnxruntime >= 1.32" in line


def test_some_kernels_on_another_provider_are_said(tiny_root, monkeypatch):
    """An op the first provider lacks runs on the next one (ORT's fallback): said, not refused."""
    _, ort_path = tiny_ort("qwen3_5", tiny_root)
    real = ort_native.missing_native_kernels
    monkeypatch.setattr(ort_native, "missing_native_kernels",
                        lambda provider, ops=ort_native.NATIVE_OPS: ["GatedRMSNorm"] if provider == "Fake" else
                        real(provider, ops))
    model = onnx.load(ort_path)
    plan = ort_native.prepare(model, providers=["Fake", "CPUExecutionProvider"])
    assert plan.kernels == "native" and "GatedRMSNorm not on Fake" in plan.note
    monkeypatch.setattr(ort_native, "missing_native_kernels", lambda provider, ops=(): list(ops))
    with pytest.raises(Exception, match="Fake / CPUExecutionProvider kernel for com.microsoft.GatedDeltaNet"):
        ort_native.check_runnable(model, providers=["Fake", "CPUExecutionProvider"])


def test_function_bodies_are_refused_for_the_ort_form(tiny_root):
    _, ort_path = tiny_ort("qwen3_5", tiny_root)
    with pytest.raises(InputError, match="--ort-kernels functions: the file is the ort form"):
        OrtRunner(ort_path, kernels="functions")
