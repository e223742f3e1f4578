"""fp32 references of the quantized routed experts (see gdn_export.ops.moe_quant for the contract).

The routing and per-expert loop of `naive.py`, each routed expert dequantized to fp32 as it is used,
with each expert's input activations fake-quantized to FP8 by that expert's static scale where the
contract says so. Written for clarity; runs on any device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gdn_export.ops.moe.naive import route
from gdn_export.ops.quant_linear.naive import e4m3, unpack_int4

BLOCK = 128


def dequantize_fp8_experts(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """weight fp8 [E, N, K], scale fp32 [E, N, G] (G = 1: per row; else groups of 128 along K)
    -> fp32 [E, N, K]."""
    K = weight.shape[-1]
    G = scale.shape[-1]
    full = scale.float() if G == 1 else scale.float().repeat_interleave(BLOCK, -1)[..., :K]
    return weight.float() * full


def dequantize_int4_experts(qweight: torch.Tensor, scale: torch.Tensor, K: int, group_size: int) -> torch.Tensor:
    """qweight uint8 [E, N, ceil(K/2)] (ONNX INT4 order), scale [E, N, ceil(K/group_size)] -> fp32 [E, N, K]."""
    E, N, _ = qweight.shape
    q = unpack_int4(qweight.reshape(E * N, -1), K).float().reshape(E, N, K)
    return q * scale.float().repeat_interleave(group_size, -1)[..., :K]


def fake_quant(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 x, fp32 0-d scale -> e4m3(clamp(x / scale, +-448)) * scale in fp32 (QUANT_CONTRACT fp8_linear)."""
    return e4m3(x / scale).float() * scale


def _experts(hidden, router_logits, gate_up_of, down_of, top_k, norm_topk_prob, in_gu=None, in_dn=None):
    """The loop of naive.moe, each routed expert's fp32 weights from gate_up_of(e) / down_of(e)
    (dequantized when used: an unrouted expert costs nothing), with optional per-expert activation
    scales."""
    x = hidden.float()
    ids, weights = route(router_logits, top_k, norm_topk_prob)
    out = torch.zeros_like(x)
    for e in torch.unique(ids).tolist():
        token, slot = torch.where(ids == e)
        xe = x[token] if in_gu is None else fake_quant(x[token], in_gu[e].float())
        h = F.linear(xe, gate_up_of(e))
        I = h.shape[1] // 2
        act = F.silu(h[:, :I]) * h[:, I:]
        if in_dn is not None:
            act = fake_quant(act, in_dn[e].float())
        y = F.linear(act, down_of(e))
        out.index_add_(0, token, y * weights[token, slot, None].float())
    return out.to(hidden.dtype)


def moe_fp8(hidden, router_logits, gate_up, gate_up_scale, down, down_scale, gate_up_input_scale=None,
            down_input_scale=None, top_k: int = 1, norm_topk_prob: bool = True) -> torch.Tensor:
    """hidden [N, H] -> out [N, H] in hidden's dtype (fp32 arithmetic)."""
    return _experts(hidden, router_logits,
                    lambda e: dequantize_fp8_experts(gate_up[e:e + 1], gate_up_scale[e:e + 1])[0],
                    lambda e: dequantize_fp8_experts(down[e:e + 1], down_scale[e:e + 1])[0],
                    top_k, norm_topk_prob, gate_up_input_scale, down_input_scale)


def moe_int4(hidden, router_logits, gate_up, gate_up_scale, down, down_scale, top_k: int = 1,
             norm_topk_prob: bool = True, group_size: int = 128) -> torch.Tensor:
    """hidden [N, H] -> out [N, H] in hidden's dtype (fp32 arithmetic, 16-bit activations)."""
    H = hidden.shape[1]
    I = gate_up.shape[1] // 2
    return _experts(hidden, router_logits,
                    lambda e: dequantize_int4_experts(gate_up[e:e + 1], gate_up_scale[e:e + 1], H, group_size)[0],
                    lambda e: dequantize_int4_experts(down[e:e + 1], down_scale[e:e + 1], I, group_size)[0],
                    top_k, norm_topk_prob)
