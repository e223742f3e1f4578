"""One torchlib translation registry per process (gdn_export.onnx.registry_cache): each export gets
a copy of its own, so one export's custom translations never reach another's."""

from __future__ import annotations

import time

import pytest
import torch

from gdn_export.onnx import registry_cache


def _registration():
    from torch.onnx._internal.exporter import _registration

    return _registration


def test_each_export_gets_its_own_copy_of_one_build():
    registration = _registration()
    with registry_cache.reuse_torchlib_registry():
        first = registration.ONNXRegistry.from_torchlib(opset_version=18)
        first.register_op(torch.ops.aten.reshape.default, lambda x, shape: x)
        start = time.perf_counter()
        second = registration.ONNXRegistry().from_torchlib(opset_version=18)  # as torch.onnx calls it
        copy_seconds = time.perf_counter() - start
        other_opset = registration.ONNXRegistry.from_torchlib(opset_version=23)
    fresh = registration.ONNXRegistry.from_torchlib(opset_version=18)
    assert second is not first and second.functions is not first.functions
    assert second.opset_version == 18 and other_opset.opset_version == 23
    # the custom translation stayed in the first export's copy
    assert len(first.get_decomps(torch.ops.aten.reshape.default)) == len(fresh.get_decomps(torch.ops.aten.reshape.default)) + 1
    assert len(second.get_decomps(torch.ops.aten.reshape.default)) == len(fresh.get_decomps(torch.ops.aten.reshape.default))
    assert set(second.functions) == set(fresh.functions)
    assert copy_seconds < 0.05  # a copy, not a build (~0.4 s)


def test_the_hook_is_restored_and_a_torch_without_it_builds_as_usual(monkeypatch):
    registration = _registration()
    original = registration.ONNXRegistry.__dict__["from_torchlib"]
    with pytest.raises(RuntimeError, match="inside"):
        with registry_cache.reuse_torchlib_registry():
            assert registration.ONNXRegistry.__dict__["from_torchlib"] is not original
            raise RuntimeError("inside")
    assert registration.ONNXRegistry.__dict__["from_torchlib"] is original
    monkeypatch.delattr(registration.ONNXRegistry, "from_torchlib")
    with registry_cache.reuse_torchlib_registry():
        assert not hasattr(registration.ONNXRegistry, "from_torchlib")
