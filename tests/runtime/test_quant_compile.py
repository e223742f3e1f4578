"""torch.compile over a quantized model (the `--compile` of bench / run on quantized checkpoints):
the gdn::fp8_linear / gdn::int4_linear custom ops trace through their fake impls as single nodes
(fullgraph=True: no graph break), on the fused siblings of the GPU runner, and the compiled model
(inductor's C++ backend on the CPU) gives the eager model's logits: fp32 to 1e-5 relative RMS
(the contract's fp32 bound; measured 1.3e-7 for fp8)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_export.modules.fused_linear import fuse_linears
from gdn_export.quantize.calibrate import apply, calibrate
from gdn_export.weights.loader import load_checkpoint
from gdn_export.weights.tiny import make_tiny_checkpoint
from tests.onnx._tiny import TWO_LAYERS

pytest.importorskip("modelopt")


@pytest.mark.parametrize("fmt", ["fp8", "int4-awq"])
def test_compiled_quantized_model_matches_eager(tmp_path, fmt, scalar_cpp_kernels):
    src = make_tiny_checkpoint(tmp_path / "bf", "qwen3_5", seed=11, **TWO_LAYERS)
    rng = np.random.default_rng(4)
    tensors = calibrate(load_checkpoint(src), fmt, [rng.integers(0, 256, 16) for _ in range(2)])
    model = apply(load_checkpoint(src, dtype=torch.float32), fmt, tensors)
    assert fuse_linears(model) > 0
    ids = torch.as_tensor(rng.integers(0, 256, (2, 7)))
    B, T = ids.shape
    args = (ids, torch.zeros(B, dtype=torch.long), torch.full((B,), T))
    torch._dynamo.reset()
    compiled = torch.compile(model, dynamic=False, fullgraph=True)
    with torch.no_grad():
        want = model(*args, *model.empty_states(B))[0]
        got = compiled(*args, *model.empty_states(B))[0]
    assert torch.isfinite(got).all()
    err = float((got - want).norm() / want.norm())
    assert err <= 1e-5, err
