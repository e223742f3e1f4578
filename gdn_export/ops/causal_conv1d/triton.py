"""The causal conv1d through the Triton kernel (kernels/causal_conv1d/triton/), gathered as the
`triton` backend by gdn_export.ops.triton_backend (see gdn_export.ops.backends for the contract)."""

from __future__ import annotations

from kernels.causal_conv1d.triton.conv import causal_conv1d as _conv


def causal_conv1d(x, weight, bias, conv_state, silu, seq_lens=None):
    """x [B, T, C]; weight [C, K]; conv_state [B, C, K - 1] -> (y [B, T, C], new conv_state), both in
    x's dtype."""
    y, state = _conv(x, weight, bias, conv_state, silu, seq_lens=seq_lens)
    return y.to(x.dtype), state.to(x.dtype)
