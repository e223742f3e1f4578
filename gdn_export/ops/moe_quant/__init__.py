"""Quantized routed experts: `gdn::moe_fp8` and `gdn::moe_int4`, the contract of the MoE op with
quantized expert weights (the 16-bit op and its routing are in `gdn_export.ops.moe`).

Same routing and SwiGLU as gdn::moe (softmax in fp32, top-k, optional renormalisation,
out[n] = sum_j w[n, j] * down[e_j] @ (silu(gate[e_j] @ x_n) * (up[e_j] @ x_n))); only the expert
weights, and for fp8 the activations that feed them, are quantized.

    moe_fp8(hidden, router_logits, gate_up, gate_up_scale, down, down_scale,
            gate_up_input_scale=None, down_input_scale=None, top_k, norm_topk_prob)   gdn::moe_fp8

        hidden [N, H] fp32 / fp16 / bf16; router_logits [N, E] float
        gate_up float8_e4m3fn [E, 2I, H]  (rows 0..I-1 gate, I..2I-1 up)
        gate_up_scale fp32 [E, 2I, G1]    G1 = 1 (one scale per output row, ModelOpt FP8) or
                                          ceil(H / 128) (one scale per row and 128-wide group along
                                          H: Qwen's published 128 x 128 blocks with each block row
                                          repeated over its 128 rows, the same weights exactly)
        down float8_e4m3fn [E, H, I]; down_scale fp32 [E, H, G2], G2 = 1 or ceil(I / 128)
        W[e, n, k] = weight[e, n, k] * scale[e, n, 0 if G == 1 else k // 128]
        gate_up_input_scale, down_input_scale: fp32 [E] (static, calibrated per expert: the FP8
        activation scale of the tokens routed to that expert) or None (activations left in 16 bits:
        the published fine-grained form, and the exported ONNX graph's arithmetic). Both or neither.
        With input scales, the activation x that enters expert e's projection is fake-quantized as
        QUANT_CONTRACT.md's fp8_linear does:
            x_q = e4m3(clamp(x.float() / s[e], -448, 448)) (round to nearest even);  x' = x_q.float() * s[e]

    moe_int4(hidden, router_logits, gate_up, gate_up_scale, down, down_scale, top_k,
             norm_topk_prob, group_size=128)                                            gdn::moe_int4

        W4A16. gate_up uint8 [E, 2I, ceil(H/2)], down uint8 [E, H, ceil(I/2)]: element (e, n, k) at
        byte k // 2, low nibble for even k, signed two's complement in [-8, 7] (the ONNX INT4 order);
        gate_up_scale [E, 2I, ceil(H/group_size)], down_scale [E, H, ceil(I/group_size)] in hidden's
        dtype (fp32 for fp32 hidden); W[e, n, k] = int4(e, n, k) * scale[e, n, k // group_size].

    out [N, H] in hidden's dtype; fp32 accumulation.

fp32 reference: `naive.py` (dequantize, fake-quantize the activations, the fp32 MoE of
gdn_export/ops/moe/naive.py). CUDA tensors run the Triton kernels of kernels/moe_quant/triton/, which read the FP8 / INT4
expert bytes and dequantize inside the kernel; everything else runs the reference. Tolerances of a
fast path against the reference (relative RMS of out): 1e-5 for fp32 hidden, 1e-2 for fp16 / bf16;
with static FP8 activation scales 5e-3 for fp32 and 2e-2 for fp16 / bf16: the down projection's
input is computed inside the op, so an element that lies on an e4m3 rounding boundary can round one
step (2^-3 of its value) apart when the fast path sums in another order (measured 5e-4 on 5 experts).

ONNX (`onnx.py`): DequantizeLinear of the stacked expert weights (FLOAT8E4M3FN per channel or
in 128-blocks, INT4 with block_size) feeding the unchanged gdn.MoE node, whose plugin receives
16-bit weights; the per-expert FP8 activation scales have no place outside that node, so the
exported graph keeps the experts' activations in 16 bits (the PyTorch model run by `validate`
does the same, see gdn_export.modules.quant_experts).
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch

from gdn_export.ops import backends

FP8 = torch.float8_e4m3fn
BLOCK = 128
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_FAST: list = []


def _fast():
    if not _FAST:
        try:
            _FAST.append(importlib.import_module("kernels.moe_quant.triton.moe_quant"))
        except ImportError:
            _FAST.append(None)
    return _FAST[0]


def _impl(device: torch.device, name: str):
    """kernels.moe_quant.triton.moe_quant.<name> for CUDA tensors when Triton imports, else the fp32 reference."""
    if device.type == "cuda" and _fast() is not None:
        return getattr(_fast(), name)
    from gdn_export.ops.moe_quant import naive as quant_naive

    return getattr(quant_naive, name)


def _check_common(hidden, router_logits, top_k) -> tuple[int, int, int]:
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [N, H], got {tuple(hidden.shape)}")
    if hidden.dtype not in _FLOATS:
        raise ValueError(f"hidden must be fp32, fp16 or bf16, got {hidden.dtype}")
    N, H = hidden.shape
    if router_logits.dim() != 2 or router_logits.shape[0] != N or not router_logits.is_floating_point():
        raise ValueError(f"router_logits must be float [N={N}, E], got {router_logits.dtype} "
                         f"{tuple(router_logits.shape)}")
    E = router_logits.shape[1]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= E:
        raise ValueError(f"top_k must be an int in [1, E={E}], got {top_k!r}")
    return N, H, E


def check_fp8(hidden, router_logits, gate_up, gate_up_scale, down, down_scale,
              gate_up_input_scale, down_input_scale, top_k) -> None:
    """ValueError naming the argument that breaks moe_fp8's contract, in one line."""
    N, H, E = _check_common(hidden, router_logits, top_k)
    if gate_up.dtype != FP8 or gate_up.dim() != 3 or gate_up.shape[0] != E or gate_up.shape[2] != H \
            or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must be float8_e4m3fn [E={E}, 2I, H={H}], got {gate_up.dtype} "
                         f"{tuple(gate_up.shape)}")
    I = gate_up.shape[1] // 2
    if down.dtype != FP8 or tuple(down.shape) != (E, H, I):
        raise ValueError(f"down must be float8_e4m3fn {(E, H, I)}, got {down.dtype} {tuple(down.shape)}")
    for name, s, N_, K in (("gate_up_scale", gate_up_scale, 2 * I, H), ("down_scale", down_scale, H, I)):
        ok = (1, -(-K // BLOCK))
        if s.dtype != torch.float32 or s.dim() != 3 or tuple(s.shape[:2]) != (E, N_) or s.shape[2] not in ok:
            raise ValueError(f"{name} must be fp32 [E={E}, {N_}, 1 or {ok[1]}], got {s.dtype} {tuple(s.shape)}")
    if (gate_up_input_scale is None) != (down_input_scale is None):
        raise ValueError("gate_up_input_scale and down_input_scale must be given together (or neither)")
    for name, s in (("gate_up_input_scale", gate_up_input_scale), ("down_input_scale", down_input_scale)):
        if s is not None and (s.dtype != torch.float32 or tuple(s.shape) != (E,)):
            raise ValueError(f"{name} must be fp32 [E={E}], got {s.dtype} {tuple(s.shape)}")


def check_int4(hidden, router_logits, gate_up, gate_up_scale, down, down_scale, top_k, group_size) -> None:
    """ValueError naming the argument that breaks moe_int4's contract, in one line."""
    N, H, E = _check_common(hidden, router_logits, top_k)
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2 or group_size % 2:
        raise ValueError(f"group_size must be an even int >= 2, got {group_size!r}")
    if gate_up.dtype != torch.uint8 or gate_up.dim() != 3 or gate_up.shape[0] != E \
            or gate_up.shape[2] != -(-H // 2) or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must be uint8 [E={E}, 2I, ceil(H/2)={-(-H // 2)}], got {gate_up.dtype} "
                         f"{tuple(gate_up.shape)}")
    I = gate_up.shape[1] // 2
    if down.dtype != torch.uint8 or tuple(down.shape) != (E, H, -(-I // 2)):
        raise ValueError(f"down must be uint8 {(E, H, -(-I // 2))}, got {down.dtype} {tuple(down.shape)}")
    for name, s, want in (("gate_up_scale", gate_up_scale, (E, 2 * I, -(-H // group_size))),
                          ("down_scale", down_scale, (E, H, -(-I // group_size)))):
        if s.dtype != hidden.dtype or tuple(s.shape) != want:
            raise ValueError(f"{name} must be {hidden.dtype} {want}, got {s.dtype} {tuple(s.shape)}")


# ------------------------------------------------------------------------ torch.library ops
@torch.library.custom_op("gdn::moe_fp8", mutates_args=())
def _moe_fp8_op(hidden: torch.Tensor, router_logits: torch.Tensor, gate_up: torch.Tensor,
                gate_up_scale: torch.Tensor, down: torch.Tensor, down_scale: torch.Tensor,
                gate_up_input_scale: Optional[torch.Tensor], down_input_scale: Optional[torch.Tensor],
                top_k: int, norm_topk_prob: bool) -> torch.Tensor:
    return _impl(hidden.device, "moe_fp8")(hidden, router_logits, gate_up, gate_up_scale, down, down_scale,
                                           gate_up_input_scale, down_input_scale, top_k, norm_topk_prob)


@_moe_fp8_op.register_fake
def _(hidden, router_logits, gate_up, gate_up_scale, down, down_scale, gate_up_input_scale,
      down_input_scale, top_k, norm_topk_prob):
    return hidden.new_empty(hidden.shape)


@torch.library.custom_op("gdn::moe_int4", mutates_args=())
def _moe_int4_op(hidden: torch.Tensor, router_logits: torch.Tensor, gate_up: torch.Tensor,
                 gate_up_scale: torch.Tensor, down: torch.Tensor, down_scale: torch.Tensor,
                 top_k: int, norm_topk_prob: bool, group_size: int) -> torch.Tensor:
    return _impl(hidden.device, "moe_int4")(hidden, router_logits, gate_up, gate_up_scale, down, down_scale,
                                            top_k, norm_topk_prob, group_size)


@_moe_int4_op.register_fake
def _(hidden, router_logits, gate_up, gate_up_scale, down, down_scale, top_k, norm_topk_prob, group_size):
    return hidden.new_empty(hidden.shape)


# ------------------------------------------------------------------------ public entries
def moe_fp8(hidden, router_logits, gate_up, gate_up_scale, down, down_scale, gate_up_input_scale=None,
            down_input_scale=None, top_k: int = 1, norm_topk_prob: bool = True) -> torch.Tensor:
    """Routed experts with FP8 weights (see module docstring): hidden [N, H] -> out [N, H]."""
    args = (hidden, router_logits, gate_up, gate_up_scale, down, down_scale, gate_up_input_scale,
            down_input_scale)
    if backends.can_call_directly(*args):
        check_fp8(*args, top_k)
        return _impl(hidden.device, "moe_fp8")(*args, int(top_k), bool(norm_topk_prob))
    return torch.ops.gdn.moe_fp8(*args, int(top_k), bool(norm_topk_prob))


def moe_int4(hidden, router_logits, gate_up, gate_up_scale, down, down_scale, top_k: int = 1,
             norm_topk_prob: bool = True, group_size: int = 128) -> torch.Tensor:
    """Routed experts with INT4 weights, 16-bit activations (see module docstring): [N, H] -> [N, H]."""
    args = (hidden, router_logits, gate_up, gate_up_scale, down, down_scale)
    if backends.can_call_directly(*args):
        check_int4(*args, top_k, group_size)
        return _impl(hidden.device, "moe_int4")(*args, int(top_k), bool(norm_topk_prob), int(group_size))
    return torch.ops.gdn.moe_int4(*args, int(top_k), bool(norm_topk_prob), int(group_size))


__all__ = ["moe_fp8", "moe_int4", "check_fp8", "check_int4"]
