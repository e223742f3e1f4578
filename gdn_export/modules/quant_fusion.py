"""Sibling projections with quantized members as few GEMMs (the runtime fusion of
gdn_export.modules.fused_linear, for quantized models).

Siblings share one input, so same-format quantized members concatenate into one quantized GEMM
when their per-input quantities agree:

    Fp8Linear       weight / weight_scale rows concatenated; input_scale must be equal (the
                    `quantize` command calibrates one shared input scale per sibling group, the max
                    of the members' amax, as ModelOpt does for fused GEMMs); unequal scales: no fusion
    Fp8BlockLinear  rows concatenated when every member but the last has a multiple of 128 rows
                    (a weight block never straddles two members); otherwise no fusion
    Int4Linear      rows concatenated when group_size and pre_quant_scale agree

Consecutive 16-bit members fuse among themselves; a group that mixes formats (Qwen3.5's GDN
q|k|v and z in FP8 with its 16-bit b and a) runs as consecutive parts, each one GEMM. Members'
buffers become row views of the fused ones (no second copy), and the fused buffers are
non-persistent, so state_dict() keeps the checkpoint's keys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gdn_export.modules.quant_linear import BLOCK, Fp8BlockLinear, Fp8Linear, Int4Linear, QuantLinear


def is_quantized(module: nn.Module) -> bool:
    return isinstance(module, QuantLinear)


class _Plain(nn.Module):
    """16-bit members as one F.linear (weight non-persistent)."""

    def __init__(self, members) -> None:
        super().__init__()
        with torch.no_grad():
            self.register_buffer("weight", torch.cat([m.weight for m in members]), persistent=False)
            bias = [m.bias for m in members]
            self.register_buffer("bias", torch.cat(bias) if all(b is not None for b in bias) else None,
                                 persistent=False)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def _rows(members, name):
    return torch.cat([getattr(m, name) for m in members])


def _fusable(run) -> bool:
    first = run[0]
    if any(type(m) is not type(first) for m in run) or any((m.bias is None) != (first.bias is None) for m in run):
        return False
    if isinstance(first, Fp8Linear):
        return all(torch.equal(m.input_scale, first.input_scale) for m in run)
    if isinstance(first, Fp8BlockLinear):
        return all(m.out_features % BLOCK == 0 for m in run[:-1])
    if isinstance(first, Int4Linear):
        same_pre = all((m.pre_quant_scale is None) == (first.pre_quant_scale is None) for m in run) and all(
            m.pre_quant_scale is None or torch.equal(m.pre_quant_scale, first.pre_quant_scale) for m in run)
        return same_pre and all(m.group_size == first.group_size for m in run)
    return type(first) is nn.Linear and all(m.weight.dtype == first.weight.dtype for m in run)


def _fuse_run(run) -> nn.Module:
    """One module computing the run's outputs concatenated; members' buffers become views."""
    first, N = run[0], sum(m.out_features for m in run)
    if type(first) is nn.Linear:
        return _Plain(run)
    with torch.no_grad():
        if isinstance(first, Fp8Linear):
            fused = Fp8Linear(first.in_features, N, device="meta")
            tensors = {"weight": _rows(run, "weight"), "weight_scale": _rows(run, "weight_scale"),
                       "input_scale": first.input_scale.clone()}
            row_of = {"weight": 1, "weight_scale": 1}
        elif isinstance(first, Fp8BlockLinear):
            fused = Fp8BlockLinear(first.in_features, N, device="meta")
            tensors = {"weight": _rows(run, "weight"), "weight_scale_inv": _rows(run, "weight_scale_inv")}
            row_of = {"weight": 1, "weight_scale_inv": BLOCK}
        else:
            fused = Int4Linear(first.in_features, N, first.group_size, dtype=first.weight_scale.dtype,
                               pre_quant_scale=first.pre_quant_scale is not None, device="meta")
            tensors = {"weight": _rows(run, "weight"), "weight_scale": _rows(run, "weight_scale")}
            if first.pre_quant_scale is not None:
                tensors["pre_quant_scale"] = first.pre_quant_scale.clone()
            row_of = {"weight": 1, "weight_scale": 1}
        if first.bias is not None:
            tensors["bias"] = _rows(run, "bias")
            row_of["bias"] = 1
    for name, t in tensors.items():
        fused.register_buffer(name, t, persistent=False)
    start = 0
    for m in run:  # members' buffers: row views of the fused ones
        for name, per in row_of.items():
            rows = -(-m.out_features // per) if per > 1 else m.out_features
            m._buffers[name] = tensors[name][start // per:start // per + rows] if per > 1 else \
                tensors[name][start:start + rows]
        start += m.out_features
    return fused


class QuantGroup:
    """Callable: x -> the members' outputs (a tuple), one GEMM per part."""

    def __init__(self, members, parts) -> None:
        self.members = tuple(members)
        self.parts = parts  # [(module, [sizes])]

    def __call__(self, x):
        outs: list[torch.Tensor] = []
        for module, sizes in self.parts:
            y = module(x)
            outs.extend(torch.split(y, sizes, dim=-1) if len(sizes) > 1 else (y,))
        return tuple(outs)


def fp8_reader(block: nn.Module):
    """The Fp8Linear (per-tensor input scale) that first reads `block`'s input when the block (a mixer
    or MLP) runs: the first part of its input projections' group (`fusible_linears()[0]`) after
    fusion, or the first of them unfused; None where that is not an Fp8Linear."""
    lister = getattr(block, "fusible_linears", None)
    linears = lister()[0] if lister is not None else ()
    if not linears:
        return None
    group = getattr(linears[0], "_fused_group", None)
    if isinstance(group, QuantGroup) and group.members == tuple(linears):
        first = group.parts[0][0]
    elif group is None:
        first = linears[0]
    else:
        return None  # 16-bit members fused among themselves
    return first if isinstance(first, Fp8Linear) else None


def fuse_quantized(members) -> int:
    """Group `members` (siblings of one input, some quantized) into parts; returns the number of
    multi-member GEMMs made (0 when nothing fused: each member keeps its own GEMM)."""
    members = tuple(members)
    if getattr(members[0], "_fused_group", None) is not None:
        return 0  # already fused (a second runner on the same model)
    runs: list[list[nn.Module]] = []
    for m in members:
        if runs and _fusable(runs[-1] + [m]):
            runs[-1].append(m)
        else:
            runs.append([m])
    if all(len(r) == 1 for r in runs):
        return 0
    parts, fused = [], 0
    for i, run in enumerate(runs):
        if len(run) == 1:
            parts.append((run[0], [run[0].out_features]))
            continue
        module = _fuse_run(run)
        members[0].add_module(f"_fused_part{i}", module)  # moves with .to(); buffers non-persistent
        parts.append((module, [m.out_features for m in run]))
        fused += 1
    group = QuantGroup(members, parts)
    for m in members:
        m._fused_group = group
    return fused
