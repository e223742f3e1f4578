"""Building blocks of the Qwen3.5 vision tower (ViT with 2-D rotary and a patch merger).

Every per-patch quantity that depends on the image grids is computed from `grid_thw` with
shape-static tensor ops (comparisons, gathers, integer arithmetic; no loops, no data-dependent
shapes), so that one exported graph serves any number of images, sizes and video frames:

    patch_layout(grid_thw [N, 3] int64, num_patches P, m) -> PatchLayout
        grid [P]      which grid (image / video) patch p belongs to
        segment [P]   which frame of all frames of the call (attention runs within a frame)
        row, col [P]  the patch's row / column in its frame; patches come in merge-block order:
                      (block_row, block_col, in_row, in_col), m x m patches per block

Shapes: P patches, E = vision hidden size, H heads of D = E / H channels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gdn_export.ops.rotary import rotate_half
from gdn_export.ops.attention import attention
from gdn_export.vision_config import GELU_APPROXIMATE, VisionConfig

LAYER_NORM_EPS = 1e-6


@dataclass
class PatchLayout:
    """Per-patch indices of a call (module docstring); every tensor [P] int64."""

    grid: torch.Tensor
    segment: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    height: torch.Tensor  # patches per column of the patch's grid
    width: torch.Tensor  # patches per row of the patch's grid


def patch_layout(grid_thw: torch.Tensor, num_patches: int | torch.SymInt, merge: int) -> PatchLayout:
    """PatchLayout of P = num_patches patches laid out by grid_thw [N, 3] (t, h, w) int64, with
    m = merge. Patches beyond sum(t*h*w) (callers refuse them) would count as the last grid's."""
    grid_thw = grid_thw.to(torch.int64)
    t, h, w = grid_thw[:, 0], grid_thw[:, 1], grid_thw[:, 2]
    counts = t * h * w  # [N]
    ends = torch.cumsum(counts, 0)
    p = torch.arange(num_patches, device=grid_thw.device)
    grid = (p[:, None] >= ends[None, :]).to(torch.int64).sum(-1)  # [P]
    grid = torch.clamp(grid, max=grid_thw.shape[0] - 1)
    start = (ends - counts)[grid]
    hh, ww = h[grid], w[grid]
    local = p - start
    frame_size = hh * ww
    frame = torch.div(local, frame_size, rounding_mode="floor")
    within = local - frame * frame_size
    frames_before = (torch.cumsum(t, 0) - t)[grid]
    blocks_w = torch.div(ww, merge, rounding_mode="floor")
    in_col = torch.remainder(within, merge)
    in_row = torch.remainder(torch.div(within, merge, rounding_mode="floor"), merge)
    block = torch.div(within, merge * merge, rounding_mode="floor")
    block_col = torch.remainder(block, blocks_w)
    block_row = torch.div(block, blocks_w, rounding_mode="floor")
    return PatchLayout(grid=grid, segment=frames_before + frame, row=block_row * merge + in_row,
                       col=block_col * merge + in_col, height=hh, width=ww)


def _axis_taps(index: torch.Tensor, size: torch.Tensor, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear (align_corners) taps [P, 2] int64 into a `side`-long axis and their weights [P, 2]
    fp32, for target `index` [P] on axes of `size` [P] samples."""
    src = index.to(torch.float32) * (side - 1) / torch.clamp(size - 1, min=1)
    floor = torch.floor(src)
    offsets = torch.arange(2, device=index.device)
    taps = torch.clamp(floor.to(torch.int64)[:, None] + offsets, 0, side - 1)
    # 1 - |d| as -|d| + 1 (the same value): an rsub would take the export through a second trace
    weights = torch.clamp((src[:, None] - floor[:, None] - offsets).abs().neg() + 1, min=0)
    return taps, weights


class VisionPositionEmbedding(nn.Module):
    """The learned side x side position grid (`pos_embed.weight` [side^2, E]) resampled bilinearly
    (align_corners) to each patch's grid: forward(layout) -> [P, E] fp32 (weights times table)."""

    def __init__(self, num_positions: int, dim: int, side: int) -> None:
        super().__init__()
        self.side = side
        self.weight = nn.Parameter(torch.empty(num_positions, dim))

    def forward(self, layout: PatchLayout) -> torch.Tensor:
        h_taps, h_w = _axis_taps(layout.row, layout.height, self.side)
        w_taps, w_w = _axis_taps(layout.col, layout.width, self.side)
        P = h_taps.shape[0]
        index = (h_taps[:, :, None] * self.side + w_taps[:, None, :]).reshape(P, 4)
        weight = (h_w[:, :, None] * w_w[:, None, :]).reshape(P, 4)
        return (F.embedding(index, self.weight) * weight[:, :, None]).sum(1)


def vision_rotary(layout: PatchLayout, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """2-D rotary tables cos, sin [P, D] fp32: the first D/4 frequencies rotate by the patch row,
    the next D/4 by its column, repeated for the two halves (rotate_half pairing)."""
    quarter = head_dim // 2
    device = layout.row.device
    inv_freq = 1.0 / (theta ** (torch.arange(0, quarter, 2, dtype=torch.float32, device=device) / quarter))
    freqs = torch.cat((layout.row[:, None].to(torch.float32) * inv_freq,
                       layout.col[:, None].to(torch.float32) * inv_freq), dim=-1)  # [P, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def frame_attention(q, k, v, frames: list[int], scale: float) -> torch.Tensor:
    """Eager attention of each frame within itself: q, k, v [1, H, P, D] with consecutive frames of
    `frames` patches (sum = P) -> [1, H, P, D]. Equal-sized frames run as one batched SDPA call
    ([F, H, L, D]); otherwise one call per frame."""
    if len(set(frames)) == 1:
        n, L = len(frames), frames[0]
        H, D = q.shape[1], q.shape[3]
        qb, kb, vb = (t[0].reshape(H, n, L, D).transpose(0, 1) for t in (q, k, v))  # [F, H, L, D]
        o = F.scaled_dot_product_attention(qb, kb, vb, scale=scale)
        return o.transpose(0, 1).reshape(1, H, n * L, D)
    outs = [F.scaled_dot_product_attention(a, b, c, scale=scale)
            for a, b, c in zip(q.split(frames, 2), k.split(frames, 2), v.split(frames, 2))]
    return torch.cat(outs, dim=2)


class VisionAttention(nn.Module):
    """Multi-head self-attention within each frame: forward(x [P, E], cos, sin [P, D], mask
    [1, 1, P, P] bool, frames) -> [P, E]. Rotary in fp32. With `frames` (eager: the patches of each
    frame, a host list) attention runs per frame (`frame_attention`, no [P, P] mask); without
    (export), through gdn::attention (ONNX Attention) under the mask."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, cos, sin, mask, frames=None):
        P = x.shape[0]
        H, D = self.num_heads, self.head_dim
        q, k, v = self.qkv(x).reshape(P, 3, H, D).unbind(1)  # [P, H, D] each
        c, s = cos[:, None], sin[:, None]
        q = (q.float() * c + rotate_half(q.float()) * s).to(x.dtype)
        k = (k.float() * c + rotate_half(k.float()) * s).to(x.dtype)
        q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))  # [1, H, P, D]
        if frames is None:
            o = attention(q, k, v, mask, D ** -0.5)
        else:
            o = frame_attention(q, k, v, frames, D ** -0.5)
        return self.proj(o[0].transpose(0, 1).reshape(P, H * D))


class VisionMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, approximate: str) -> None:
        super().__init__()
        self.approximate = approximate
        self.linear_fc1 = nn.Linear(dim, hidden)
        self.linear_fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate=self.approximate))


class VisionBlock(nn.Module):
    """Pre-norm ViT block: x + attn(norm1(x)), then x + mlp(norm2(x)); LayerNorms eps 1e-6."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        E = config.hidden_size
        self.norm1 = nn.LayerNorm(E, eps=LAYER_NORM_EPS)
        self.norm2 = nn.LayerNorm(E, eps=LAYER_NORM_EPS)
        self.attn = VisionAttention(E, config.num_heads)
        self.mlp = VisionMLP(E, config.intermediate_size, GELU_APPROXIMATE[config.hidden_act])

    def forward(self, x, cos, sin, mask, frames=None):
        x = x + self.attn(self.norm1(x), cos, sin, mask, frames)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """LayerNorm per patch, then each m x m block of consecutive patches as one row [m^2 E] through
    fc1, GELU (exact), fc2: forward(x [P, E]) -> [P / m^2, out_hidden]."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        E = config.hidden_size
        self.merged = E * config.merge_unit
        self.norm = nn.LayerNorm(E, eps=LAYER_NORM_EPS)
        self.linear_fc1 = nn.Linear(self.merged, self.merged)
        self.linear_fc2 = nn.Linear(self.merged, config.out_hidden_size)

    def forward(self, x):
        x = self.norm(x)
        x = x.reshape(math.prod(x.shape) // self.merged, self.merged)  # no -1: one trace (gdn_export.onnx.one_trace)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class PatchEmbed(nn.Module):
    """The Conv3d patch embedding (stride = kernel) as one Linear over a patch's C*Tp*P*P values
    (the conv weight [E, C, Tp, P, P] flattened to [E, C*Tp*P*P], same order as pixel_values rows):
    forward(pixel_values [P, C*Tp*P*P]) -> [P, E]."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.proj = nn.Linear(config.patch_dim, config.hidden_size)

    def forward(self, x):
        return self.proj(x.to(self.proj.weight.dtype))
