"""Sibling projections of one input as one GEMM: a runtime speed-up, not a new checkpoint layout.

A decode step at batch 1 is a chain of matrix-vector products, each a pass over its weight; a
GEMM far below a few tens of MB does not reach the copy bandwidth (launch, ramp, split-K
reduction). The modules keep transformers' separate projections (q / k / v / z / b / a, gate / up)
so that checkpoints load and exported graphs keep their names, and call them through
`project_together(x, *linears)`: after `fuse_linears(model)` (the GraphRunner's fast path) the
siblings' weights are rows of one tensor and the call is one `F.linear` split into the same
outputs; before, it is the separate calls, so nothing changes for export or the CPU runners.

The fused weight is built once; each member's `weight` (and `bias`) becomes a view into it, so the
parameters, `state_dict()` and memory stay as they were (no second copy of the weights). The fused
tensors are non-persistent buffers of the first member, so `model.to(...)` / `.half()` carry them
along (the views then become copies: still the same values, twice the memory).

Quantized projections (gdn_export.modules.quant_linear) are grouped by `fuse_quantized`
(gdn_export.modules.quant_fusion): same-format siblings become one quantized GEMM; a group that
mixes 16-bit and quantized members (Qwen3.5's GDN q/k/v/z with its 16-bit b / a) runs as parts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _Group:
    """`members` and each one's output width; the fused weight [sum(out), in] (+ bias) lives on the
    first member as the buffers `_fused_weight` / `_fused_bias`."""

    def __init__(self, members: tuple[nn.Linear, ...]) -> None:
        self.members = members
        self.sizes = [m.out_features for m in members]
        has_bias = [m.bias is not None for m in members]
        if any(has_bias) and not all(has_bias):
            raise ValueError("fuse_linears: either every member has a bias or none")
        with torch.no_grad():
            weight = torch.cat([m.weight for m in members])
            bias = torch.cat([m.bias for m in members]) if all(has_bias) else None
        start = 0
        for m, size in zip(members, self.sizes):
            # Views: the separate weights are freed, the module tree stays the same.
            m.weight = nn.Parameter(weight[start:start + size], requires_grad=False)
            if bias is not None:
                m.bias = nn.Parameter(bias[start:start + size], requires_grad=False)
            m._fused_group = self
            start += size
        members[0].register_buffer("_fused_weight", weight, persistent=False)
        members[0].register_buffer("_fused_bias", bias, persistent=False)


def project_together(x: torch.Tensor, *linears: nn.Linear) -> tuple[torch.Tensor, ...]:
    """(linear(x) for linear in linears), as one GEMM when `fuse_linears` grouped exactly these."""
    group = getattr(linears[0], "_fused_group", None)
    if group is not None and group.members == linears and callable(group):
        return group(x)
    if group is not None and group.members == linears:
        first = linears[0]
        return torch.split(F.linear(x, first._fused_weight, first._fused_bias), group.sizes, dim=-1)
    return tuple(linear(x) for linear in linears)


def fuse(*linears: nn.Linear) -> None:
    """Group these projections of one input (same in_features, dtype and device) into one GEMM."""
    first = linears[0]
    for m in linears:
        if (m.in_features, m.weight.dtype, m.weight.device) != (first.in_features, first.weight.dtype,
                                                                first.weight.device):
            raise ValueError("fuse_linears: members must share in_features, dtype and device")
        if getattr(m, "_fused_group", None) is not None:
            return  # already fused (a second runner on the same model)
    _Group(tuple(linears))


def fuse_linears(model: nn.Module) -> int:
    """Fuse the sibling projections of every module that lists them (`fusible_linears()`: tuples
    of its nn.Linear children fed the same input). Returns how many groups were fused."""
    from gdn_export.modules.quant_fusion import fuse_quantized, is_quantized

    groups = 0
    for module in model.modules():
        lister = getattr(module, "fusible_linears", None)
        if lister is None:
            continue
        for members in lister():
            if len(members) > 1:
                if any(is_quantized(m) for m in members):
                    groups += fuse_quantized(members)
                else:
                    fuse(*members)
                    groups += 1
    return groups
