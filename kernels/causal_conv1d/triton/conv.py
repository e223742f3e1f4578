"""Depthwise causal conv1d with a rolling state, SiLU fused: prefill and the single-step update.

One kernel serves both: program (channel block, time block, batch) sums K shifted rows of
xs = [conv_state | x] (rows before t = 0 come from the state), and the time block 0 program also
writes the new state, the last K-1 columns of xs. At T = 1 that is one program per channel block.

    y[b, t, c] = bias[c] + sum_{j < K} weight[c, j] xs[b, c, t + j]   (then SiLU if asked)

Ragged rows (seq_lens [B], right padding) change only the new state: it is the K-1 columns of xs
ending at the row's last real token, xs[b, :, L_b : L_b + K-1], with L_b clamped to [0, T].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_utils import cdiv, next_pow2, pdl_enter, pdl_launch


@triton.jit
def _xs_rows(x, conv_state, i_b, o_src, o_c, m_c, T, C, sxb, sxt, K: tl.constexpr, HAS_STATE: tl.constexpr):
    # Rows o_src of x (o_src < 0 reads state column K - 1 + o_src), [len(o_src), BC] fp32. x's rows
    # sit sxt elements apart, its batch rows sxb (a channel slice of a wider tensor is not copied).
    m_x = (o_src >= 0) & (o_src < T)
    b_x = tl.load(x + i_b.to(tl.int64) * sxb + o_src[:, None] * sxt + o_c[None, :],
                  mask=m_x[:, None] & m_c[None, :], other=0).to(tl.float32)
    if HAS_STATE:
        o_s = o_src + K - 1
        m_s = (o_src < 0) & (o_s >= 0)
        b_x += tl.load(conv_state + (i_b * C + o_c[None, :]) * (K - 1) + o_s[:, None],
                       mask=m_s[:, None] & m_c[None, :], other=0).to(tl.float32)
    return b_x


# T is left unspecialised: one compiled kernel serves every length.
@triton.jit(do_not_specialize=["T"])
def causal_conv1d_fwd_kernel(
    x, weight, bias, conv_state, seq_lens, y, new_state,
    T, C, sxb, sxt,
    K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr, HAS_LENS: tl.constexpr, SILU: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    pdl_enter(USE_PDL)
    i_c, i_t, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_t = i_t * BT + tl.arange(0, BT)
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    if HAS_BIAS:
        b_y = tl.zeros([BT, BC], dtype=tl.float32) + tl.load(bias + o_c, mask=m_c, other=0).to(tl.float32)[None, :]
    else:
        b_y = tl.zeros([BT, BC], dtype=tl.float32)
    if HAS_STATE and i_t * BT < K - 1:
        # only the first time block reaches back into the state
        for j in tl.static_range(K):
            b_w = tl.load(weight + o_c * K + j, mask=m_c, other=0).to(tl.float32)
            b_y += _xs_rows(x, conv_state, i_b, o_t + j - (K - 1), o_c, m_c, T, C, sxb, sxt, K, True) * b_w[None, :]
    else:
        for j in tl.static_range(K):
            b_w = tl.load(weight + o_c * K + j, mask=m_c, other=0).to(tl.float32)
            b_y += _xs_rows(x, conv_state, i_b, o_t + j - (K - 1), o_c, m_c, T, C, sxb, sxt, K, False) * b_w[None, :]
    if SILU:
        b_y = b_y * tl.sigmoid(b_y)
    tl.store(y + (i_b * T + o_t[:, None]) * C + o_c[None, :], b_y.to(y.dtype.element_ty),
             mask=(o_t[:, None] < T) & m_c[None, :])
    if i_t == 0:
        # new_state[:, j] = xs[L + j] = x[L - (K - 1) + j] (or the old state when L < K - 1)
        if HAS_LENS:
            L = tl.minimum(tl.maximum(tl.load(seq_lens + i_b).to(tl.int32), 0), T)
        else:
            L = T
        o_j = tl.arange(0, BS)
        b_s = _xs_rows(x, conv_state, i_b, L - (K - 1) + o_j, o_c, m_c, T, C, sxb, sxt, K, HAS_STATE)
        tl.store(new_state + (i_b * C + o_c[None, :]) * (K - 1) + o_j[:, None],
                 b_s.to(new_state.dtype.element_ty), mask=(o_j[:, None] < K - 1) & m_c[None, :])


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    conv_state: torch.Tensor | None = None,
    silu: bool = True,
    seq_lens: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    new_conv_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv1d over time (prefill, or decode at T = 1).

    Args:
        x: [B, T, C] fp32/fp16/bf16, channels contiguous (any token / batch strides). weight: [C, K].
            bias: [C] or None.
        conv_state: [B, C, K-1], the K-1 inputs before x, or None for zeros. Must not alias
            new_conv_state (other programs may still read it).
        silu: apply SiLU.
        seq_lens: [B] int32 real tokens per right-padded row, or None for all T; clamped to
            [0, T] in the kernel (no host sync to check them).
        out, new_conv_state: optional preallocated outputs.
    Returns:
        y [B, T, C] and new_conv_state [B, C, K-1], both in x's dtype.
    """
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[0] != x.shape[2]:
        raise ValueError(f"need x [B, T, C] and weight [C, K], got {tuple(x.shape)} and {tuple(weight.shape)}")
    B, T, C = x.shape
    K = weight.shape[1]
    if conv_state is not None and tuple(conv_state.shape) != (B, C, K - 1):
        raise ValueError(f"conv_state must be [B, C, K-1] = {(B, C, K - 1)}, got {tuple(conv_state.shape)}")
    if seq_lens is not None and tuple(seq_lens.shape) != (B,):
        raise ValueError(f"seq_lens must be [B={B}], got {tuple(seq_lens.shape)}")
    dtype = torch.float32 if x.dtype == torch.float64 else x.dtype
    if x.dtype != dtype or x.stride(2) != 1:
        x = x.to(dtype).contiguous()  # rows and batch rows may keep any stride (channel slices)
    weight = weight.contiguous()
    bias = None if bias is None else bias.contiguous()
    conv_state = None if conv_state is None else conv_state.contiguous()
    seq_lens = None if seq_lens is None else seq_lens.to(device=x.device, dtype=torch.int32).contiguous()
    y = out if out is not None else x.new_empty(B, T, C)
    s = new_conv_state if new_conv_state is not None else x.new_empty(B, C, K - 1)
    # decode: a couple of rows per program and wide channel blocks; prefill: 64 x 128 tiles
    BT = min(next_pow2(max(T, 2)), 64)
    BC = 128 if T > 1 else 256
    grid = (cdiv(C, BC), cdiv(T, BT), B)
    causal_conv1d_fwd_kernel[grid](
        x, weight, bias, conv_state, seq_lens, y, s, T, C, x.stride(0), x.stride(1),
        K=K, BT=BT, BC=BC, BS=max(next_pow2(K - 1), 2),
        HAS_BIAS=bias is not None, HAS_STATE=conv_state is not None, HAS_LENS=seq_lens is not None,
        SILU=bool(silu), **pdl_launch(y),
    )
    return y, s
