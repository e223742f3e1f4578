"""bf16 graphs on ONNX Runtime's CPU provider (gdn_export.onnx.bf16): each op's bf16 output rounded
where the graph rounds it; bf16 / bf16-state exports PASS validate's parity against the torch bf16
model, and a deliberately wrong bf16 graph FAILs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from gdn_export.layout import DeployLayout
from gdn_export.onnx.bf16 import emulate_bf16, has_bf16
from gdn_export.runtime.ort_runner import OrtRunner
from gdn_export.runtime.torch_runner import TorchRunner
from gdn_export.validate.compare import Tolerances, default_tolerances, run_parity
from tests.onnx._tiny import tiny_export

BF16, F32 = TensorProto.BFLOAT16, TensorProto.FLOAT


def _graph():
    """y = bf16(x) * w + bf16(x) (w a bf16 initializer), z = Cast(y, fp32) * 3 in fp32."""
    w = torch.randn(64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    w_init = numpy_helper.from_array(w.view(torch.int16).numpy().view(ml_dtypes.bfloat16), "w")
    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=BF16),
             helper.make_node("Mul", ["xb", "w"], ["m"]),
             helper.make_node("Add", ["m", "xb"], ["y"]),
             helper.make_node("Cast", ["y"], ["yf"], to=F32),
             helper.make_node("Constant", [], ["three"], value=helper.make_tensor("t", F32, [], [3.0])),
             helper.make_node("Mul", ["yf", "three"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, [64])],
                              [helper.make_tensor_value_info("z", F32, [64])], [w_init])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)]), w


def test_every_bf16_output_is_rounded_as_torch_rounds_it():
    model, w = _graph()
    assert has_bf16(model)
    emulated = emulate_bf16(model)
    assert not has_bf16(emulated) or all(n.op_type == "Cast" for n in emulated.graph.node
                                         if any(a.name == "to" and a.i == BF16 for a in n.attribute))
    x = torch.randn(64) * 10
    got = ort.InferenceSession(emulated.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.numpy()})[0]
    xb = x.to(torch.bfloat16)
    want = ((xb * w) + xb).float() * 3  # torch rounds every bf16 op's output to bf16
    np.testing.assert_array_equal(got, want.numpy())
    unrounded = (x.to(torch.bfloat16).float() * w.float() + x.to(torch.bfloat16).float()) * 3
    assert not np.array_equal(got, unrounded.numpy())  # the rounding is really there


# The torch model of the same dtype is the reference; validate's default tolerances.
CASES = {"bf16-model-bf16-state": (torch.bfloat16, "bfloat16"),
         "bf16-model-fp32-state": (torch.bfloat16, "float32"),
         "fp32-model-bf16-state": (torch.float32, "bfloat16")}


def _export(root, dtype, state):
    return tiny_export("qwen3_5", root, dtype=dtype, layout=DeployLayout.make(cache_len=160, state_dtype=state))


def _report(model, runner, dtype, state):
    atol, rtol = default_tolerances(str(dtype).removeprefix("torch."), state)
    return run_parity(TorchRunner(model), [runner], vocab_size=runner.vocab_size,
                      tolerances=Tolerances(atol, rtol), batch=3, prompt_len=40, decode_steps=4)


@pytest.mark.parametrize("kernels", ["native", "functions"])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_bf16_exports_pass_validate_parity(tiny_root, case, kernels):
    dtype, state = CASES[case]
    model, path = _export(tiny_root, dtype, state)
    runner = OrtRunner(path, kernels=kernels)
    assert runner.bf16_emulated and runner.kernels == kernels and "rounded to bf16" in runner.kernels_note
    report = _report(model, runner, dtype, state)
    assert report.passed, [r for r in report.rows if not r.passed][:3]


def test_a_wrong_bf16_graph_fails(tiny_root, tmp_path):
    """The same bf16 export with one projection weight (the first 2-D bf16 weight after the
    embedding) 50% too large: validate must FAIL."""
    model, path = _export(tiny_root, torch.bfloat16, "bfloat16")
    proto = onnx.load(path)
    weights = [t for t in proto.graph.initializer if t.data_type == BF16 and len(t.dims) == 2
               and "embed" not in t.name]
    target = weights[0]
    arr = numpy_helper.to_array(target).astype(np.float32) * 1.5
    target.CopyFrom(numpy_helper.from_array(arr.astype(numpy_helper.to_array(target).dtype), target.name))
    wrong = tmp_path / "wrong.onnx"
    onnx.save(proto, wrong)
    report = _report(model, OrtRunner(wrong), torch.bfloat16, "bfloat16")
    assert not report.passed
    assert any(r.tensor == "logits" and not r.passed for r in report.rows)
