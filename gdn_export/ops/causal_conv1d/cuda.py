"""The causal conv1d through our CUDA kernels (kernels/causal_conv1d/cuda/causalConv1dKernels.cu, bound by
gdn_export/cuda/extension.cpp and built by gdn_export.cuda.extension): the `cuda` backend's entries
for this op (gdn_export.ops.cuda_backend).

    causal_conv1d(x [B, T, C], weight [C, K], bias [C] | None, conv_state [B, C, K-1] | None, silu,
                  seq_lens [B] int32 | None) -> (y [B, T, C], new_conv_state [B, C, K-1])
    causal_conv1d_out(..., y, new_conv_state): into given buffers (new_conv_state may be conv_state)
    causal_conv1d_inplace(..., conv_state, ...) -> y: the state updated where it lies

Activations are fp32, fp16 or bf16 (float64 runs in fp32 and is cast back); K <= MAX_CONV_KERNEL.
Tensors must be on a CUDA device.
"""

from __future__ import annotations

import torch

from gdn_export.cuda import extension
from gdn_export.cuda.extension import check_out, compute_dtype, require_cuda
from gdn_export.errors import GdnExportError
from gdn_export.ops.causal_conv1d import check_inputs as _check_conv_inputs

MAX_CONV_KERNEL = 8  # kMAX_K in causalConv1dKernels.cu


def _conv_args(x, weight, bias, conv_state, seq_lens=None):
    try:
        _check_conv_inputs(x, weight, bias, conv_state, seq_lens)
    except ValueError as exc:
        raise GdnExportError(f"cuda backend: {exc}") from exc
    if weight.shape[1] > MAX_CONV_KERNEL:
        raise GdnExportError(f"cuda backend: conv kernel size must be 1..{MAX_CONV_KERNEL}, got {weight.shape[1]}")
    require_cuda(x=x, weight=weight, bias=bias, conv_state=conv_state, seq_lens=seq_lens)
    dt = compute_dtype(x.dtype, "x")
    cast = lambda t: None if t is None else t.to(dt).contiguous()  # noqa: E731
    lens = None if seq_lens is None else seq_lens.to(torch.int32).contiguous()
    return cast(x), cast(weight), cast(bias), cast(conv_state), lens


def causal_conv1d(x, weight, bias, conv_state, silu, seq_lens=None):
    """Returns fresh y [B, T, C] and new_conv_state [B, C, K-1], both in x's dtype. seq_lens [B]
    (right-padded rows, None = all T) is clamped to [0, T] by the kernel."""
    out_dtype = x.dtype
    x, weight, bias, conv_state, seq_lens = _conv_args(x, weight, bias, conv_state, seq_lens)
    y, state = extension.load().causal_conv1d(x, weight, bias, conv_state, bool(silu), None, None, seq_lens)
    return y.to(out_dtype), state.to(out_dtype)


def causal_conv1d_out(x, weight, bias, conv_state, silu, y, new_conv_state, seq_lens=None):
    """Writes into y and new_conv_state (which may be conv_state itself)."""
    x, weight, bias, _, seq_lens = _conv_args(x, weight, bias, conv_state, seq_lens)
    B, T, C = x.shape
    K = weight.shape[1]
    check_out("y", y, (B, T, C), x.dtype, x.device)
    check_out("new_conv_state", new_conv_state, (B, C, K - 1), x.dtype, x.device)
    if conv_state is not None:
        check_out("conv_state", conv_state, (B, C, K - 1), x.dtype, x.device)
    extension.load().causal_conv1d(x, weight, bias, conv_state, bool(silu), y, new_conv_state, seq_lens)
    return y, new_conv_state


def causal_conv1d_inplace(x, weight, bias, conv_state, silu, seq_lens=None):
    """Convolution step that updates `conv_state` [B, C, K-1] (x's dtype, contiguous) in place; returns y."""
    if conv_state.dtype != x.dtype or not conv_state.is_contiguous():
        raise GdnExportError(f"in-place conv_state must be contiguous {x.dtype}, got {conv_state.dtype}")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    causal_conv1d_out(x, weight, bias, conv_state, silu, y, conv_state, seq_lens)
    return y
