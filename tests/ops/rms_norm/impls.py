"""Every implementation of RMSNorm as contract-suite parameters: `run(inp)` returns y. The fused
kernel writes into a NaN-poisoned buffer."""

from __future__ import annotations

from tests.ops.impl import Impl, poisoned


def _naive(inp):
    from gdn_export.ops.rms_norm.naive import rms_norm

    return rms_norm(inp["x"], inp["weight"], inp["eps"], inp["zero_centered"], inp["gate"])


def _op(inp):
    """The public op with the triton backend active: the fused kernel on a GPU, the PyTorch form on a
    CPU (the dispatch's own tests are in test_dispatch.py)."""
    from gdn_export.ops import use_backend
    from gdn_export.ops.rms_norm import rms_norm

    with use_backend("triton"):
        return rms_norm(inp["x"], inp["weight"], inp["eps"], inp["zero_centered"], inp["gate"])


def _triton(inp):
    from gdn_export.ops.rms_norm import rms_norm_fused

    out = poisoned(inp["x"].shape, inp["x"].dtype, inp["x"].device)
    y = rms_norm_fused(inp["x"], inp["weight"], inp["eps"], inp["zero_centered"], inp["gate"], out=out)
    assert y.data_ptr() == out.data_ptr()
    return y


IMPLS = [
    Impl("reference", "reference", _naive),
    Impl("op-triton-backend", "triton", _op),
    Impl("triton", "triton", _triton),
]
