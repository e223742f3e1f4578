"""fp32 references of the quantized-linear ops (see gdn_export.ops.quant_linear for the contract).

Each dequantizes the weight to fp32, fake-quantizes the activations exactly as the contract says,
runs one fp32 matmul and returns y in x's dtype. They run on any device (the CPU path of the ops and
the yardstick of the GPU kernels).
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
BLOCK = 128  # fine-grained FP8: weight blocks of 128 x 128, activation groups of 128
MIN_GROUP_AMAX = 1e-10


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """fp32 x -> float8_e4m3fn after clamping to +-448 (round to nearest even)."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def _out(y: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def fp8_linear(x, weight, weight_scale, input_scale, bias=None):
    """x [..., K]; weight fp8 [N, K]; weight_scale fp32 [N]; input_scale fp32 [] -> y [..., N]."""
    scale = input_scale.float()
    x_q = e4m3(x.float() / scale).float()
    y = (x_q @ weight.float().T) * (scale * weight_scale.float())
    return _out(y, x, bias)


def dequantize_block(weight: torch.Tensor, weight_scale_inv: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """weight fp8 [N, K], weight_scale_inv [ceil(N/block), ceil(K/block)] -> fp32 W [N, K]."""
    N, K = weight.shape
    scale = weight_scale_inv.float().repeat_interleave(block, 0)[:N].repeat_interleave(block, 1)[:, :K]
    return weight.float() * scale


def quantize_groups(x: torch.Tensor, group: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token groups: fp32 x [M, K] -> (x_q fp8 [M, K], s fp32 [M, ceil(K/group)])."""
    M, K = x.shape
    G = -(-K // group)
    padded = torch.nn.functional.pad(x, (0, G * group - K)).reshape(M, G, group)
    s = padded.abs().amax(-1).clamp(min=MIN_GROUP_AMAX) / FP8_MAX
    x_q = e4m3(padded / s[..., None]).reshape(M, G * group)[:, :K]
    return x_q, s


def fp8_block_linear(x, weight, weight_scale_inv, bias=None):
    """x [..., K]; weight fp8 [N, K]; weight_scale_inv [ceil(N/128), ceil(K/128)] -> y [..., N]."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1]).float()
    x_q, s = quantize_groups(flat)
    # x_q * s per group, then against the dequantized weight: the same sum as the contract's
    # per-group products (each group's scale factors out of its dot product).
    x_deq = x_q.float() * s.repeat_interleave(BLOCK, 1)[:, : shape[-1]]
    y = x_deq @ dequantize_block(weight, weight_scale_inv).T
    return _out(y, x, bias).reshape(*shape[:-1], weight.shape[0])


def unpack_int4(qweight: torch.Tensor, K: int) -> torch.Tensor:
    """uint8 [N, ceil(K/2)] (low nibble = even k, two's complement) -> int8 [N, K] in [-8, 7]."""
    low = (qweight & 0x0F).to(torch.int8)
    high = (qweight >> 4).to(torch.int8)
    both = torch.stack((low, high), dim=-1).reshape(qweight.shape[0], -1)[:, :K]
    return torch.where(both >= 8, both - 16, both)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int [N, K] in [-8, 7] -> uint8 [N, ceil(K/2)] (low nibble = even k)."""
    N, K = q.shape
    if K % 2:
        q = torch.nn.functional.pad(q, (0, 1))
    u = (q.to(torch.int16) & 0x0F).to(torch.uint8).reshape(N, -1, 2)
    return u[..., 0] | (u[..., 1] << 4)


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, K: int, group_size: int) -> torch.Tensor:
    """-> fp32 W [N, K] = int4 * scales[:, k // group_size]."""
    q = unpack_int4(qweight, K).float()
    return q * scales.float().repeat_interleave(group_size, 1)[:, :K]


def int4_linear(x, qweight, scales, bias=None, group_size: int = 128, pre_scale=None):
    """x [..., K]; qweight uint8 [N, ceil(K/2)]; scales [N, ceil(K/group_size)]; pre_scale [K] or None
    (x * pre_scale rounded to x's dtype first) -> y [..., N]."""
    if pre_scale is not None:
        x = x * pre_scale.to(x.dtype)
    W = dequantize_int4(qweight, scales, x.shape[-1], group_size)
    return _out(x.float() @ W.T, x, bias)
