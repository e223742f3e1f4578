"""Quantized routed experts: the model-side holders of `gdn::moe_fp8` / `gdn::moe_int4`, swapped in
for `MoeExperts` (gdn_export.modules.mlp) by the loader or by `gdn-export quantize`.

    Fp8MoeExperts   gate_up_proj fp8 [E, 2I, H], gate_up_proj_weight_scale fp32 [E, 2I, G1],
                    down_proj fp8 [E, H, I], down_proj_weight_scale fp32 [E, H, G2] and, for the
                    ModelOpt FP8 form ("fp8"), static per-expert activation scales
                    gate_up_proj_input_scale / down_proj_input_scale fp32 [E] (G = 1: per output
                    channel). The published fine-grained form ("fp8-block128") has no input scales
                    and G = ceil(K / 128) (each 128 x 128 block's scale repeated over its rows).
    Int4MoeExperts  gate_up_proj uint8 [E, 2I, ceil(H/2)], down_proj uint8 [E, H, ceil(I/2)] (two
                    int4 a byte, ONNX order), *_weight_scale [E, N, ceil(K/group_size)] in the model
                    dtype (W4A16, round-to-nearest: see gdn_export.quantize.experts).

routed(x [N, H], router_logits [N, E], top_k, norm_topk_prob) -> [N, H] in x's dtype; called by
gdn_export.ops.moe.sparse_moe_forward in place of the 16-bit op. `activations = "16bit"` (set by
`validate` on its PyTorch reference, as for Fp8BlockLinear) runs Fp8MoeExperts without its FP8
activation rounding: the exported graph's arithmetic. `model.to(dtype)` leaves the fp8 weights and
fp32 scales alone; only Int4MoeExperts' scales follow the model dtype.
"""

from __future__ import annotations

import torch
from torch import nn

from gdn_export.modules.quant_linear import FixedDtypeBuffers
from gdn_export.ops.moe_quant import BLOCK, moe_fp8, moe_int4

FP8 = torch.float8_e4m3fn
FP8_FORMATS = ("fp8", "fp8-block128")


class QuantMoeExperts(FixedDtypeBuffers):
    """Common base: num_experts, hidden_size, intermediate_size, FORMAT; `FIXED` buffers keep
    their dtype whatever the model's."""

    FORMAT = ""
    QUANTIZED_EXPERTS = True

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden={self.hidden_size}, "
                f"intermediate={self.intermediate_size}, format={self.FORMAT}")


class Fp8MoeExperts(QuantMoeExperts):
    FIXED = ("gate_up_proj", "down_proj", "gate_up_proj_weight_scale", "down_proj_weight_scale",
             "gate_up_proj_input_scale", "down_proj_input_scale")
    activations = "static"

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, form: str = "fp8",
                 device=None) -> None:
        super().__init__(num_experts, hidden_size, intermediate_size)
        if form not in FP8_FORMATS:
            raise ValueError(f"form must be one of {FP8_FORMATS}, got {form!r}")
        self.FORMAT = form
        E, H, I = num_experts, hidden_size, intermediate_size
        g1, g2 = (1, 1) if form == "fp8" else (-(-H // BLOCK), -(-I // BLOCK))
        f32 = dict(dtype=torch.float32, device=device)
        self.register_buffer("gate_up_proj", torch.empty(E, 2 * I, H, dtype=FP8, device=device))
        self.register_buffer("gate_up_proj_weight_scale", torch.empty(E, 2 * I, g1, **f32))
        self.register_buffer("down_proj", torch.empty(E, H, I, dtype=FP8, device=device))
        self.register_buffer("down_proj_weight_scale", torch.empty(E, H, g2, **f32))
        static = form == "fp8"
        self.register_buffer("gate_up_proj_input_scale", torch.empty(E, **f32) if static else None)
        self.register_buffer("down_proj_input_scale", torch.empty(E, **f32) if static else None)

    def routed(self, x: torch.Tensor, router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool) -> torch.Tensor:
        static = self.activations == "static"
        return moe_fp8(x, router_logits, self.gate_up_proj, self.gate_up_proj_weight_scale, self.down_proj,
                       self.down_proj_weight_scale, self.gate_up_proj_input_scale if static else None,
                       self.down_proj_input_scale if static else None, top_k, norm_topk_prob)


class Int4MoeExperts(QuantMoeExperts):
    FORMAT = "int4-awq"
    FIXED = ("gate_up_proj", "down_proj")

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, group_size: int = 128,
                 dtype: torch.dtype = torch.bfloat16, device=None) -> None:
        super().__init__(num_experts, hidden_size, intermediate_size)
        self.group_size = group_size
        E, H, I = num_experts, hidden_size, intermediate_size
        u8 = dict(dtype=torch.uint8, device=device)
        self.register_buffer("gate_up_proj", torch.empty(E, 2 * I, -(-H // 2), **u8))
        self.register_buffer("gate_up_proj_weight_scale", torch.empty(E, 2 * I, -(-H // group_size), dtype=dtype,
                                                                      device=device))
        self.register_buffer("down_proj", torch.empty(E, H, -(-I // 2), **u8))
        self.register_buffer("down_proj_weight_scale", torch.empty(E, H, -(-I // group_size), dtype=dtype,
                                                                   device=device))

    def routed(self, x: torch.Tensor, router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool) -> torch.Tensor:
        return moe_int4(x, router_logits, self.gate_up_proj, self.gate_up_proj_weight_scale.to(x.dtype),
                        self.down_proj, self.down_proj_weight_scale.to(x.dtype), top_k, norm_topk_prob,
                        self.group_size)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", group_size={self.group_size}"


def dequantized_experts(m: QuantMoeExperts) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (gate_up [E, 2I, H], down [E, H, I]): the weights the quantized experts multiply by."""
    from gdn_export.ops.moe_quant.naive import dequantize_fp8_experts, dequantize_int4_experts

    if isinstance(m, Fp8MoeExperts):
        return (dequantize_fp8_experts(m.gate_up_proj, m.gate_up_proj_weight_scale),
                dequantize_fp8_experts(m.down_proj, m.down_proj_weight_scale))
    return (dequantize_int4_experts(m.gate_up_proj, m.gate_up_proj_weight_scale, m.hidden_size, m.group_size),
            dequantize_int4_experts(m.down_proj, m.down_proj_weight_scale, m.intermediate_size, m.group_size))


def swap_experts(model: nn.Module, name: str, module: nn.Module) -> nn.Module:
    """Replace the experts submodule `name` (dotted) of model by `module`; returns the old one."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old = getattr(parent, child)
    setattr(parent, child, module)
    return old

