"""`VisionConfig`: the vision tower and token ids of a Qwen3.5 / Qwen3.5-MoE composite config.json.

transformers' `Qwen3_5VisionConfig` (also used by Qwen3.5-MoE) fields, with its defaults where
config.json is silent:

    depth 27, hidden_size 1152, hidden_act gelu_pytorch_tanh, intermediate_size 4304, num_heads 16,
    in_channels 3, patch_size 16, spatial_merge_size 2, temporal_patch_size 2, out_hidden_size 3584,
    num_position_embeddings 2304 (a square grid), rope_parameters {rope_type axial, rope_theta 1e4}

and the composite's token ids (`image_token_id` 248056, `video_token_id` 248057,
`vision_start_token_id` 248053, `vision_end_token_id` 248054). A field gdn-export cannot honour
is a ConfigError naming it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from gdn_export.config import COMPOSITE
from gdn_export.errors import ConfigError

_VISION_DEFAULTS: dict[str, Any] = {
    "depth": 27, "hidden_size": 1152, "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 4304,
    "num_heads": 16, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
    "temporal_patch_size": 2, "out_hidden_size": 3584, "num_position_embeddings": 2304,
}
_TOKEN_DEFAULTS = {"image_token_id": 248056, "video_token_id": 248057,
                   "vision_start_token_id": 248053, "vision_end_token_id": 248054}
# transformers' ACT2FN names -> torch.nn.functional.gelu's `approximate`
GELU_APPROXIMATE = {"gelu_pytorch_tanh": "tanh", "gelu": "none", "gelu_new": "tanh"}


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower (ViT + patch merger) and the placeholder token ids.

    A patch is C x Tp x P x P pixels (in_channels, temporal_patch_size, patch_size); m x m patches
    (m = spatial_merge_size) merge into one token of out_hidden_size (the language model's hidden).
    """

    depth: int
    hidden_size: int
    hidden_act: str
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    spatial_merge_size: int
    temporal_patch_size: int
    out_hidden_size: int
    num_position_embeddings: int
    rope_theta: float
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values per patch row of pixel_values: C * Tp * P * P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def grid_side(self) -> int:
        """Side of the square learned position-embedding grid."""
        return math.isqrt(self.num_position_embeddings)

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        for name in ("depth", "hidden_size", "intermediate_size", "num_heads", "in_channels",
                     "patch_size", "spatial_merge_size", "temporal_patch_size", "out_hidden_size",
                     "num_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"vision_config.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"vision_config.hidden_size ({self.hidden_size}) must be a multiple of "
                              f"num_heads ({self.num_heads})")
        if self.head_dim % 4:
            raise ConfigError(f"vision head size {self.head_dim} must be a multiple of 4 (2-D rotary "
                              f"over height and width)")
        if self.grid_side ** 2 != self.num_position_embeddings:
            raise ConfigError(f"vision_config.num_position_embeddings ({self.num_position_embeddings}) "
                              f"must be a square number")
        if self.hidden_act not in GELU_APPROXIMATE:
            raise ConfigError(f"vision_config.hidden_act {self.hidden_act!r} is not supported (one of "
                              f"{', '.join(GELU_APPROXIMATE)})")
        ids = [self.image_token_id, self.video_token_id, self.vision_start_token_id, self.vision_end_token_id]
        if any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in ids):
            raise ConfigError(f"image / video / vision_start / vision_end token ids must be integers "
                              f">= 0, got {ids}")


def has_vision(d: dict[str, Any]) -> bool:
    """Whether a transformers config.json dict describes a composite model with a vision tower."""
    return d.get("model_type") in COMPOSITE and isinstance(d.get("vision_config"), dict)


def parse_vision_config(d: dict[str, Any]) -> VisionConfig:
    """VisionConfig of a composite (`qwen3_5` / `qwen3_5_moe`) config.json dict."""
    if not has_vision(d):
        raise ConfigError(f"model_type {d.get('model_type')!r} has no vision_config (vision-language "
                          f"checkpoints are {', '.join(COMPOSITE)})")
    v = d["vision_config"]
    fields = {name: v.get(name, default) if v.get(name) is not None else default
              for name, default in _VISION_DEFAULTS.items()}
    for name in ("patch_size", "temporal_patch_size"):
        if isinstance(fields[name], (list, tuple)):
            sizes = set(fields[name])
            if len(sizes) != 1:
                raise ConfigError(f"vision_config.{name} {fields[name]!r}: only equal sizes are supported")
            fields[name] = sizes.pop()
    rope = v.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ConfigError(f"vision_config.rope_parameters must be an object, got {rope!r}")
    rope_type = rope.get("rope_type", "axial")
    if rope_type not in ("axial", "default"):
        raise ConfigError(f"vision_config.rope_parameters.rope_type {rope_type!r} is not supported "
                          f"(only axial)")
    try:
        theta = float(rope.get("rope_theta", 10000.0))
    except (TypeError, ValueError):
        raise ConfigError(f"vision_config rope_theta must be a number, got {rope.get('rope_theta')!r}") from None
    tokens = {name: d.get(name, default) if d.get(name) is not None else default
              for name, default in _TOKEN_DEFAULTS.items()}
    config = VisionConfig(**fields, rope_theta=theta, **tokens)
    config.validate()
    return config
