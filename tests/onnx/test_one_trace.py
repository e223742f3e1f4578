"""One trace per export (gdn_export.onnx.one_trace): torch.onnx's run_decompositions skipped where
it changes nothing ONNX sees. Which programs skip, which must still be decomposed and why, the
rewrites that stand in for the decomposition, each against torch.onnx's own path node for node
(canonical graphs: ops, attributes, wiring, value types, initializer bytes). The whole models
(every family, 16-bit and quantized, the vision-language language graph) are compared in
tests/onnx/test_stamp.py: its stamped graphs are traced once, its whole traces decomposed."""

from __future__ import annotations

import numpy as np
import onnx_ir
import pytest
import torch

from gdn_export.onnx import export as export_module
from gdn_export.onnx import one_trace
from tests.onnx._same import canonical_difference
from tests.onnx.test_stamp import decomposition_reasons


# ------------------------------------------------------------------------------ which programs skip
class _Reshapes(torch.nn.Module):
    """x [B, T, 4, 8] -> reshape to [B, T, 32] (static last dim), chunk in two, cast, masks."""

    def forward(self, x, m):
        B, T = x.shape[:2]
        y = x.reshape(B, T, 32)
        a, b = y.chunk(2, dim=-1)
        keep = (m & (m > 0)) | ~m
        return a.to(torch.float16), b * keep[..., None].to(b.dtype)


class _Constant(torch.nn.Module):
    """torch.tensor(...) in forward: a fresh copy of a constant, detached in place (lift_fresh_copy,
    detach_), as the vision-language model's rotary streams are made."""

    def forward(self, x, m):
        scale = torch.tensor([1.0, 2.0, 0.5, -1.0], dtype=torch.float32)
        return x * scale[:, None], m


class _Flatten(torch.nn.Module):
    def forward(self, x, m):
        return x.flatten(1), m  # flatten: decomposed by the dispatcher, not rewritten here


class _MinusOne(torch.nn.Module):
    def forward(self, x, m):
        return x.reshape(-1, 8), m  # the row count B * T * 4 is a product of dynamic dims


class _InPlace(torch.nn.Module):
    def forward(self, x, m):
        y = x * 2
        y.add_(1)
        return y, m


def _program(module):
    from torch.export import Dim

    B, T = Dim("B", min=1), Dim("T", min=1)
    x, m = torch.randn(2, 3, 4, 8), torch.rand(2, 3) > 0.5
    with torch.no_grad():
        return torch.export.export(module, (x, m), dynamic_shapes=({0: B, 1: T}, {0: B, 1: T}), strict=False)


def _registry():
    from torch.onnx._internal.exporter import _registration

    from gdn_export.onnx.registry_cache import reuse_torchlib_registry

    with reuse_torchlib_registry():
        return _registration.ONNXRegistry.from_torchlib()


@pytest.mark.parametrize("module, reason", [
    (_Flatten(), "aten.flatten.using_ints is decomposed"),
    (_MinusOne(), "a reshape to -1 over a dynamic dim"),
    (_InPlace(), "aten.add_.Tensor mutates its input"),
], ids=["flatten", "reshape-minus-one", "in-place"])
def test_programs_the_skip_cannot_serve_are_decomposed_with_the_reason(module, reason, monkeypatch):
    assert one_trace.plan(_program(module), _registry())[0] == reason
    reasons, one, decomposed = _both_ways(module, monkeypatch)
    assert reasons == [f"decomposed: {reason}"]  # and the export goes on through torch.onnx's path
    assert canonical_difference(one, decomposed) is None


def test_the_ops_torch_onnx_always_decomposes_are_rewritten_as_their_decomposition():
    program = _program(_Reshapes())
    reason, rewrites = one_trace.plan(program, _registry())
    assert reason is None
    aten = torch.ops.aten
    got = sorted((str(node.target), str(new[0])) for node, new in rewrites.items())
    assert got == sorted([(str(aten.chunk.default), str(aten.split.Tensor)),
                          (str(aten.to.dtype), str(aten._to_copy.default)),
                          (str(aten.to.dtype), str(aten._to_copy.default)),  # both casts
                          (str(aten.__and__.Tensor), str(aten.bitwise_and.Tensor)),
                          (str(aten.__or__.Tensor), str(aten.bitwise_or.Tensor))])
    split = next(new for node, new in rewrites.items() if node.target is aten.chunk.default)
    assert split[1][1:] == (16, -1)  # chunks of 32 / 2 along the last dim


def _ort(proto, feeds):
    import onnxruntime as ort

    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _both_ways(module, monkeypatch):
    """(reasons the skip path gave, its graph, torch.onnx's own graph) of `module` exported with
    dynamic B, T."""
    from torch.export import Dim

    B, T = Dim("B", min=1), Dim("T", min=1)
    args = (torch.randn(2, 3, 4, 8), torch.rand(2, 3) > 0.5)
    graphs = []
    with decomposition_reasons() as reasons:
        for enabled in (True, False):
            monkeypatch.setattr(one_trace, "ENABLED", enabled)
            graphs.append(export_module.run_exporter(module, args, ({0: B, 1: T}, {0: B, 1: T}), ["x", "m"],
                                                     ["y", "n"], 18))
    return reasons, *graphs


@pytest.mark.parametrize("module", [_Reshapes(), _Constant()], ids=["rewritten-ops", "constant-in-forward"])
def test_the_rewritten_programs_give_torch_onnx_s_graph(monkeypatch, module):
    reasons, one, decomposed = _both_ways(module, monkeypatch)
    assert reasons == []
    message = canonical_difference(one, decomposed)
    assert message is None, message


def test_a_constant_made_in_forward_is_detached_out_of_place():
    reason, rewrites = one_trace.plan(_program(_Constant()), _registry())
    assert reason is None and [str(new[0]) for new in rewrites.values()] == [str(torch.ops.aten.detach.default)]


@pytest.mark.parametrize("enabled", [True, False], ids=["one-trace", "decomposed"])
def test_a_reshape_keeps_a_runtime_zero_dim(monkeypatch, enabled):
    """Reshape with allowzero: a batch of 0 rows at run time stays 0 (torchlib's translation of
    aten.reshape itself would copy the input's dim there); both paths give the same outputs."""
    from torch.export import Dim

    monkeypatch.setattr(one_trace, "ENABLED", enabled)
    x, m = torch.randn(2, 3, 4, 8), torch.rand(2, 3) > 0.5
    B, T = Dim("B", min=1), Dim("T", min=1)
    ir_model = export_module.run_exporter(_Reshapes(), (x, m), ({0: B, 1: T}, {0: B, 1: T}), ["x", "m"],
                                          ["a", "b"], 18)
    proto = onnx_ir.serde.serialize_model(ir_model)
    reshape = [n for n in proto.graph.node if n.op_type == "Reshape"]
    assert reshape and all(any(a.name == "allowzero" and a.i == 1 for a in n.attribute) for n in reshape)
    for rows in (0, 3):
        xs = np.random.default_rng(rows).standard_normal((rows, 5, 4, 8)).astype(np.float32)
        ms = np.ones((rows, 5), dtype=bool)
        a, b = _ort(proto, {"x": xs, "m": ms})
        want_a, want_b = _Reshapes()(torch.from_numpy(xs), torch.from_numpy(ms))
        assert a.shape == (rows, 5, 16) and b.shape == (rows, 5, 16)
        np.testing.assert_array_equal(a, want_a.numpy())
        np.testing.assert_array_equal(b, want_b.numpy())


def test_the_environment_turns_the_skip_off(monkeypatch):
    def refuse(*_args):
        raise AssertionError("the skip was consulted")

    monkeypatch.setattr(one_trace, "plan", refuse)
    monkeypatch.setenv(one_trace.ENV, "0")
    assert not one_trace.enabled()
    from torch.export import Dim

    B, T = Dim("B", min=1), Dim("T", min=1)
    export_module.run_exporter(_Reshapes(), (torch.randn(2, 3, 4, 8), torch.rand(2, 3) > 0.5),
                               ({0: B, 1: T}, {0: B, 1: T}), ["x", "m"], ["a", "b"], 18)
    monkeypatch.setenv(one_trace.ENV, "1")
    assert one_trace.enabled()


def test_the_hook_is_restored_and_a_torch_without_it_exports_as_usual(monkeypatch):
    from torch.onnx._internal.exporter import _fx_passes

    original = _fx_passes.decompose_with_registry
    with pytest.raises(RuntimeError, match="inside"):
        with one_trace.skip_redundant_decomposition():
            assert _fx_passes.decompose_with_registry is not original
            raise RuntimeError("inside")
    assert _fx_passes.decompose_with_registry is original
    monkeypatch.delattr(_fx_passes, "decompose_with_registry")
    with one_trace.skip_redundant_decomposition():
        assert not hasattr(_fx_passes, "decompose_with_registry")


@pytest.mark.slow
def test_the_vision_graph_is_traced_once_with_torch_onnx_s_graph(tmp_path_factory, monkeypatch):
    """The vision tower (bilinear position taps, 2-D rotary, patch merger) of a transformers-made
    vision-language checkpoint: traced once, the same graph as torch.onnx's own path."""
    pytest.importorskip("transformers")
    from gdn_export.vlm.export import trace_vision
    from gdn_export.vlm.weights import load_vision
    from tests.vlm_models import hf_checkpoint

    _, directory = hf_checkpoint("qwen3_5", tmp_path_factory)
    vision = load_vision(directory)
    graphs = []
    with decomposition_reasons() as reasons:
        for enabled in (True, False):
            monkeypatch.setattr(one_trace, "ENABLED", enabled)
            graphs.append(trace_vision(vision, 18))
    assert reasons == []
    message = canonical_difference(*graphs)
    assert message is None, message
