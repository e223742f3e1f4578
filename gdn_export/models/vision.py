"""`VisionEncoder`: the Qwen3.5 / Qwen3.5-MoE vision tower, one call for any images and videos.

    forward(pixel_values [P, C*Tp*Ps*Ps], grid_thw [N, 3] int64) -> visual_embeds [P / m^2, out_hidden]

pixel_values are transformers' Qwen3.5 image processor output (`pixel_values` or
`pixel_values_videos`): one row per patch, patches of each grid in merge-block order, grids in
order; grid_thw the matching `image_grid_thw` / `video_grid_thw` (t = 1 for an image). The result
equals transformers' `get_image_features(...).pooler_output` concatenated: one row per
placeholder token, grids in order. Module names follow the checkpoint (`model.visual.` stripped):
patch_embed.proj, pos_embed, blocks.{i}.norm1 / attn.qkv / attn.proj / norm2 / mlp.linear_fc1 /
mlp.linear_fc2, merger.norm / linear_fc1 / linear_fc2 (see gdn_export.vlm.weights).

Pipeline: patch embedding (a Linear), plus the learned position grid resampled to each frame;
`depth` pre-norm ViT blocks with 2-D rotary (row, column), each frame attending within itself
(exported: a [P, P] mask from grid_thw, gdn_export.modules.vision.patch_layout; eager: per frame); the merger turns each
m x m block into one token. The model dtype is the parameters' dtype; the position weights,
rotary and attention softmax compute in fp32.
"""

from __future__ import annotations

import torch
from torch import nn

from gdn_export.errors import InputError
from gdn_export.ops.backends import exporting
from gdn_export.modules.vision import (PatchEmbed, PatchMerger, VisionBlock, VisionPositionEmbedding,
                                       patch_layout, vision_rotary)
from gdn_export.vision_config import VisionConfig


class VisionEncoder(nn.Module):
    """See module docstring."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.config = config
        self.check_inputs = True
        # Eager calls attend per frame (host-side frame sizes); False uses the exported graph's
        # masked attention over all patches in eager mode too.
        self.per_frame = True
        self.patch_embed = PatchEmbed(config)
        self.pos_embed = VisionPositionEmbedding(config.num_position_embeddings, config.hidden_size,
                                                 config.grid_side)
        self.blocks = nn.ModuleList(VisionBlock(config) for _ in range(config.depth))
        self.merger = PatchMerger(config)

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embed.proj.weight.dtype

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        if self.check_inputs and not torch.compiler.is_compiling():
            check_grid(pixel_values.shape, grid_thw, self.config)
        c = self.config
        layout = patch_layout(grid_thw, pixel_values.shape[0], c.spatial_merge_size)
        x = self.patch_embed(pixel_values)
        x = x + self.pos_embed(layout).to(x.dtype)
        cos, sin = vision_rotary(layout, c.head_dim, c.rope_theta)
        if exporting() or torch.compiler.is_compiling() or not self.per_frame:
            frames = None
            mask = (layout.segment[:, None] == layout.segment[None, :])[None, None]  # [1, 1, P, P]
        else:  # eager: each frame's attention on its own, no [P, P] mask
            frames = [int(h) * int(w) for t, h, w in grid_thw.tolist() for _ in range(int(t))]
            mask = None
        for block in self.blocks:
            x = block(x, cos, sin, mask, frames)
        return self.merger(x)


def check_grid(pixel_shape, grid_thw, config: VisionConfig) -> None:
    """InputError unless pixel_values of `pixel_shape` and grid_thw [N, 3] (torch or numpy
    integers) describe the same patches for `config`: rows = sum(t*h*w), width = C*Tp*P*P, h and w
    multiples of the merge size, every entry >= 1."""
    import numpy as np

    grid = np.asarray(grid_thw.cpu() if isinstance(grid_thw, torch.Tensor) else grid_thw)
    if grid.ndim != 2 or grid.shape[1] != 3 or grid.shape[0] < 1:
        raise InputError(f"grid_thw must be [num_images, 3] (t, h, w), got shape {tuple(grid.shape)}")
    if not np.issubdtype(grid.dtype, np.integer):
        raise InputError(f"grid_thw must be integers, got {grid.dtype}")
    if len(pixel_shape) != 2:
        raise InputError(f"pixel_values must be [num_patches, {config.patch_dim}], got shape {tuple(pixel_shape)}")
    if (grid < 1).any():
        raise InputError(f"grid_thw entries must be >= 1, got {grid.tolist()}")
    m = config.spatial_merge_size
    bad = grid[(grid[:, 1] % m != 0) | (grid[:, 2] % m != 0)]
    if len(bad):
        raise InputError(f"grid (t, h, w) = {tuple(int(v) for v in bad[0])}: h and w must be multiples of "
                         f"the spatial merge size {m}")
    patches = int((grid[:, 0] * grid[:, 1] * grid[:, 2]).sum())
    if pixel_shape[0] != patches:
        raise InputError(f"pixel_values has {pixel_shape[0]} patch rows but grid_thw {grid.tolist()} "
                         f"describes {patches}")
    if pixel_shape[1] != config.patch_dim:
        raise InputError(f"pixel_values rows have {pixel_shape[1]} values, expected {config.patch_dim} "
                         f"(channels {config.in_channels} x frames {config.temporal_patch_size} x "
                         f"{config.patch_size} x {config.patch_size})")


def merged_tokens(grid_thw, merge: int) -> list[int]:
    """Placeholder tokens of each grid: t * h * w / m^2."""
    return [int(t) * int(h) * int(w) // (merge * merge) for t, h, w in grid_thw]
