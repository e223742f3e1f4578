"""The standard form (`export_onnx(..., onnx_ops="standard")`) of every family: the file (opset-27
LinearAttention / CausalConvWithState, same I/O as the gdn form), and both forms on ONNX Runtime
(native kernels and function bodies) against the PyTorch model: ragged rows, decode, streaming, fp16,
state dtypes. export_onnx writes its gdn file, then rewrites it; the tests take that rewrite of the
shared gdn exports (tiny_standard), and one checks it is byte for byte what export_onnx writes."""

from __future__ import annotations

from collections import Counter

import onnx
import pytest
import torch

from gdn_export.config import LINEAR
from gdn_export.errors import GdnExportError
from gdn_export.layout import DeployLayout
from gdn_export.onnx import export_onnx, metadata, standard_ops
from gdn_export.runtime.ort_runner import OrtRunner
from gdn_export.runtime.torch_runner import TorchRunner
from tests.onnx._parity import assert_parity
from tests.onnx._same import assert_same_graph, file_digest, graph_difference
from tests.onnx._tiny import CONCAT, FAMILIES, TEST_LAYOUT, tiny_export, tiny_standard

def standard_export(family, root, dtype=torch.float32, layout=TEST_LAYOUT):
    """(model, gdn path, standard path): the same model in both forms, the standard one rewritten
    from the gdn file as export_onnx does (test_export_onnx_standard_is_the_rewritten_gdn_export)."""
    model, gdn_path = tiny_export(family, root, dtype=dtype, layout=layout)
    _, std_path = tiny_standard(family, root, dtype=dtype, layout=layout)
    return model, gdn_path, std_path


@pytest.fixture(scope="module", params=FAMILIES)
def both(request, tiny_root):
    return (request.param, *standard_export(request.param, tiny_root))


def test_standard_file_has_the_opset27_ops_and_the_gdn_io(both):
    family, model, gdn_path, std_path = both
    gdn, std = onnx.load(gdn_path), onnx.load(std_path)
    n_linear = model.config.layer_kinds.count(LINEAR)
    ops = Counter((n.domain, n.op_type) for n in std.graph.node)
    assert ops[("", "LinearAttention")] == ops[("", "CausalConvWithState")] == n_linear
    assert ops[("gdn", "GatedDeltaRule")] == ops[("gdn", "CausalConv1d")] == 0
    has_moe = ops[("gdn", "MoE")] > 0
    assert {e.domain: e.version for e in std.opset_import} == {"": 27, **({"gdn": 1} if has_moe else {})}
    for node in std.graph.node:
        if node.op_type == "LinearAttention":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            assert attrs["update_rule"] == b"gated_delta"
            assert attrs["q_num_heads"] == attrs["kv_num_heads"] == model.config.linear_num_value_heads
    assert std.graph.input == gdn.graph.input and std.graph.output == gdn.graph.output
    props = {p.key: p.value for p in std.metadata_props}
    gdn_props = {p.key: p.value for p in gdn.metadata_props}
    assert props.pop(standard_ops.KEY_ONNX_OPS) == "standard"
    assert props.pop(standard_ops.KEY_GDN_OPSET) == gdn_props.pop(metadata.KEY_OPSET) == "24"
    assert props.pop(metadata.KEY_OPSET) == "27" and props == gdn_props
    onnx.checker.check_model(str(std_path), full_check=True)
    onnx.shape_inference.infer_shapes(std, check_type=True, strict_mode=True)
    back = standard_ops.to_gdn(std)
    assert_same_graph(back.graph, gdn.graph)


def test_export_onnx_standard_is_the_rewritten_gdn_export(tiny_root):
    """export_onnx(..., onnx_ops="standard") traces once and writes what rewriting its own gdn
    export gives, byte for byte: the other tests here take the rewritten file (no second trace)."""
    _, traced = tiny_export("qwen3_5", tiny_root, onnx_ops="standard")
    _, rewritten = tiny_standard("qwen3_5", tiny_root)
    if file_digest(traced) != file_digest(rewritten):
        a, b = onnx.load(traced), onnx.load(rewritten)
        where = graph_difference(a.graph, b.graph)
        a.ClearField("graph"), b.ClearField("graph")
        pytest.fail(where or ("the models differ outside the graph" if a != b else "equal models, other bytes"))


def test_both_forms_on_native_kernels_and_function_bodies_match_torch(both):
    """Ragged prefill of 65 / 33 / 1 tokens, then 4 forced decode steps; every logits and state row."""
    _, model, gdn_path, std_path = both
    runners = [OrtRunner(std_path), OrtRunner(gdn_path), OrtRunner(std_path, kernels="functions")]
    assert [r.kernels for r in runners] == ["native", "native", "functions"]
    assert_parity(TorchRunner(model), runners)


@pytest.mark.slow
@pytest.mark.parametrize("prompt_len", [1, 130], ids=["prompt1", "prompt130"])
def test_standard_form_prompt_lengths(tiny_root, prompt_len):
    model, _, std_path = standard_export("qwen3_5", tiny_root)
    assert_parity(TorchRunner(model), [OrtRunner(std_path)], prompt_len=prompt_len, steps=2, batch=2)


@pytest.mark.slow
def test_standard_form_streams_far_past_the_window(tiny_root):
    layout = DeployLayout.make(sinks=2, window=8)
    model, gdn_path, std_path = standard_export("qwen3_5", tiny_root, layout=layout)
    assert_parity(TorchRunner(model), [OrtRunner(std_path), OrtRunner(gdn_path, kernels="functions")],
            prompt_len=11, steps=30, batch=2)


@pytest.mark.slow
def test_standard_form_concat_layout(tiny_root):
    model, _, std_path = standard_export("qwen3_next", tiny_root, layout=CONCAT)
    assert_parity(TorchRunner(model), [OrtRunner(std_path)], prompt_len=20, steps=3, batch=2)


@pytest.mark.slow
@pytest.mark.parametrize("dtype,state", [(torch.float16, "float16"), (torch.float32, "float16"),
                                         (torch.float16, "float32")],
                         ids=["fp16-fp16state", "fp32-fp16state", "fp16-fp32state"])
def test_standard_form_dtypes_and_state_dtypes(tiny_root, dtype, state):
    """The torch model of the same dtype is the reference; tolerances are validate's defaults."""
    layout = DeployLayout.make(cache_len=160, state_dtype=state)
    model, gdn_path, std_path = standard_export("qwen3_5", tiny_root, dtype=dtype, layout=layout)
    std = OrtRunner(std_path)
    assert {s.name: s.dtype for s in std.state_specs} == {s.name: s.dtype for s in OrtRunner(gdn_path).state_specs}
    assert_parity(TorchRunner(model), [std, OrtRunner(gdn_path, kernels="functions")],
            dtype=str(dtype).removeprefix("torch."), state=state, prompt_len=40, steps=3, batch=2)


def test_an_unknown_form_is_refused_before_tracing(tiny_root, tmp_path):
    model, _ = tiny_export("qwen3_5", tiny_root)
    with pytest.raises(GdnExportError, match="--onnx-ops 'tensorrt': choose one of gdn, standard"):
        export_onnx(model, tmp_path / "x.onnx", onnx_ops="tensorrt")
    assert not list(tmp_path.iterdir())
