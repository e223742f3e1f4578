"""Golden fp32 reference of the depthwise causal convolution with a rolling state.

With the state s [B, C, K-1] holding the K-1 inputs before x, and xs = concat(s, x^T) along time:

    y[b, t, c] = bias[c] + sum_{j < K} weight[c, j] * xs[b, c, t + j]      (then SiLU if asked)
    new_state  = xs[:, :, -(K-1):]

With per-row lengths L [B] (right padding: only x[b, :L_b] is real) the state ends after the last
real token, new_state[b] = xs[b, :, L_b : L_b + K-1]; y is computed the same everywhere (its values
at padded positions mean nothing but are finite).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    conv_state: torch.Tensor | None = None,
    silu: bool = True,
    seq_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv1d over time.

    Args:
        x: [B, T, C]. weight: [C, K]. bias: [C] or None.
        conv_state: [B, C, K-1] (the K-1 inputs before x) or None for zeros.
        silu: apply SiLU to the output.
        seq_lens: [B] integer, real tokens per row (right padding), or None for all T. Clamped to
            [0, T] as the kernels do (the op checks the range first).
    Returns:
        y [B, T, C] in x's dtype, new_conv_state [B, C, K-1] in x's dtype.
    """
    B, T, C = x.shape
    K = weight.shape[-1]
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    xt = x.to(compute).transpose(1, 2)  # [B, C, T]
    if conv_state is None:
        conv_state = xt.new_zeros(B, C, K - 1)
    xs = torch.cat([conv_state.to(compute), xt], dim=-1)  # [B, C, K-1+T]
    b = None if bias is None else bias.to(compute)
    y = F.conv1d(xs, weight.to(compute)[:, None, :], b, groups=C)  # [B, C, T]
    if silu:
        y = F.silu(y)
    if seq_lens is None:
        new_state = xs[:, :, xs.shape[-1] - (K - 1):]
    else:
        # new_state[b, :, i] = xs[b, :, L_b + i]: a gather of copies, so bit-identical to the row alone
        lens = seq_lens.to(device=x.device, dtype=torch.int64).clamp(0, T)
        index = (lens[:, None] + torch.arange(K - 1, device=x.device))[:, None, :].expand(B, C, K - 1)
        new_state = xs.gather(2, index)
    return y.transpose(1, 2).to(x.dtype), new_state.to(x.dtype).contiguous()
