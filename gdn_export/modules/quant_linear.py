"""Quantized Linear layers: the model-side holders of the `gdn_export.ops.quant_linear` ops.

    Fp8Linear       weight fp8 [N, K], weight_scale fp32 [N], input_scale fp32 []     (ModelOpt FP8)
    Fp8BlockLinear  weight fp8 [N, K], weight_scale_inv fp32 [ceil(N/128), ceil(K/128)]
                    (published fine-grained FP8: Qwen3-Next-*-FP8, Qwen3.5-*-FP8)
    Int4Linear      weight uint8 [N, ceil(K/2)] (two int4 a byte, ONNX packing), weight_scale
                    [N, ceil(K/group_size)] in the model dtype, pre_quant_scale [K] (AWQ, or None)
                    (ModelOpt W4A16_AWQ)

forward(x [..., K]) -> [..., N] in x's dtype, as nn.Linear. Buffer names are those of the on-disk
checkpoints, so `state_dict()` keys are the checkpoint keys. `model.to(dtype)` / `.half()` leave the
fp8 weights and the fp32 scales alone (only Int4Linear's scales follow the model dtype, as the op
wants scales in x's dtype).

`swap_linear(model, name, module)` replaces the nn.Linear called `name` (meta or real) in place.
"""

from __future__ import annotations

import torch
from torch import nn

from gdn_export.ops.quant_linear import (BLOCK, fp8_block_linear, fp8_linear, fp8_linear_quantized, int4_linear,
                                         take_quantized)
from gdn_export.ops.quant_linear.naive import dequantize_block

FP8 = torch.float8_e4m3fn


class FixedDtypeBuffers(nn.Module):
    """A module whose buffers named in `FIXED` keep their dtype when the model is cast
    (`.to(dtype)`, `.half()`): quantized weights and their fp32 scales. Shared by the quantized
    linear layers and the quantized routed experts (gdn_export.modules.quant_experts)."""

    FIXED: tuple[str, ...] = ()

    def fixed_dtypes(self) -> dict[str, torch.dtype]:
        """{buffer name: dtype} for the buffers that keep their dtype whatever the model's."""
        return {name: getattr(self, name).dtype for name in self.FIXED if getattr(self, name, None) is not None}

    def _apply(self, fn, recurse=True):
        fixed = self.fixed_dtypes()
        super()._apply(fn, recurse)
        for name, dtype in fixed.items():
            t = getattr(self, name)
            if t.dtype != dtype:
                self._buffers[name] = t.to(dtype)
        return self


class QuantLinear(FixedDtypeBuffers):
    """Common base: in_features, out_features, bias (None: the quantized projections of these
    models have none). `FORMAT` names the on-disk form; `FIXED` lists buffers whose dtype never
    follows the model's."""

    FORMAT = ""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.bias = None

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.FORMAT}"


class Fp8Linear(QuantLinear):
    FORMAT = "fp8"
    FIXED = ("weight", "weight_scale", "input_scale")

    def __init__(self, in_features: int, out_features: int, device=None) -> None:
        super().__init__(in_features, out_features)
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=FP8, device=device))
        self.register_buffer("weight_scale", torch.empty(out_features, dtype=torch.float32, device=device))
        self.register_buffer("input_scale", torch.empty((), dtype=torch.float32, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = take_quantized(x, self.input_scale)  # x's FP8 form, written by the norm that made x
        if pre is not None:
            return fp8_linear_quantized(x, *pre, self.weight, self.weight_scale, self.input_scale, self.bias)
        return fp8_linear(x, self.weight, self.weight_scale, self.input_scale, self.bias)


class Fp8BlockLinear(QuantLinear):
    """`activations`: "dynamic" (default: the checkpoint's per-token groups-of-128 FP8 activations,
    gdn::fp8_block_linear) or "16bit" (the exported ONNX form: the same FP8 weights, activations left
    in 16 bits; `validate` sets it on its PyTorch reference so that both run the same arithmetic)."""

    FORMAT = "fp8-block128"
    FIXED = ("weight", "weight_scale_inv")
    activations = "dynamic"

    def __init__(self, in_features: int, out_features: int, device=None) -> None:
        super().__init__(in_features, out_features)
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=FP8, device=device))
        self.register_buffer("weight_scale_inv", torch.empty(
            -(-out_features // BLOCK), -(-in_features // BLOCK), dtype=torch.float32, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activations == "16bit":
            W = dequantize_block(self.weight, self.weight_scale_inv).to(x.dtype)
            return torch.nn.functional.linear(x, W, self.bias)
        return fp8_block_linear(x, self.weight, self.weight_scale_inv, self.bias)


class Int4Linear(QuantLinear):
    FORMAT = "int4-awq"
    FIXED = ("weight",)

    def __init__(self, in_features: int, out_features: int, group_size: int = 128,
                 dtype: torch.dtype = torch.bfloat16, pre_quant_scale: bool = True, device=None) -> None:
        super().__init__(in_features, out_features)
        self.group_size = group_size
        self.register_buffer("weight", torch.empty(out_features, -(-in_features // 2), dtype=torch.uint8,
                                                   device=device))
        self.register_buffer("weight_scale", torch.empty(out_features, -(-in_features // group_size),
                                                         dtype=dtype, device=device))
        self.register_buffer("pre_quant_scale", torch.empty(in_features, dtype=dtype, device=device)
                             if pre_quant_scale else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = None if self.pre_quant_scale is None else self.pre_quant_scale.to(x.dtype)
        return int4_linear(x, self.weight, self.weight_scale.to(x.dtype), self.bias, self.group_size, pre)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", group_size={self.group_size}"


def swap_linear(model: nn.Module, name: str, module: nn.Module) -> nn.Module:
    """Replace submodule `name` (dotted) of model by `module`; returns the old one."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old = getattr(parent, child)
    setattr(parent, child, module)
    return old


def fixed_dtypes(model: nn.Module) -> dict[str, torch.dtype]:
    """{state_dict name: dtype} of every quantized buffer that keeps its own dtype (the loader reads
    those tensors in that dtype rather than the model's)."""
    out = {}
    for prefix, module in model.named_modules():
        if isinstance(module, QuantLinear) or getattr(module, "QUANTIZED_EXPERTS", False):
            for name, dtype in module.fixed_dtypes().items():
                out[f"{prefix}.{name}"] = dtype
    return out


def quantized_formats(model: nn.Module) -> set[str]:
    """The FORMATs of the quantized layers and routed experts in model (empty for a 16-bit model)."""
    return {m.FORMAT for m in model.modules() if isinstance(m, QuantLinear) or getattr(m, "QUANTIZED_EXPERTS", False)}
