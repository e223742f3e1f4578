"""Images and pixel-value files -> `VisualInputs`, as transformers' Qwen3.5 image processor makes them.

    load_images(paths, vision_config, processor_config) -> VisualInputs
    load_pixel_values(path.npz) -> VisualInputs

Images are read with Pillow and converted by transformers' `Qwen2VLImageProcessorPil` (the
processor Qwen3.5 / Qwen3.5-MoE checkpoints name): RGB, resized so that both sides are multiples of
patch_size x merge_size within the processor's pixel budget, rescaled, normalised, cut into
patches. Its settings come from the checkpoint's preprocessor_config.json (export records it in
the vision file's metadata, `gdn_export.vlm.preprocessor`), else the processor's defaults with the
vision config's patch, temporal patch and merge sizes. A file that is not an image is an
InputError naming it. A .npz holds the processor's output: `pixel_values` + `image_grid_thw`
and / or `pixel_values_videos` + `video_grid_thw`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from gdn_export.errors import InputError

PREPROCESSOR_FILE = "preprocessor_config.json"
_SETTINGS = ("size", "do_convert_rgb", "do_resize", "resample", "do_rescale", "rescale_factor",
             "do_normalize", "image_mean", "image_std", "min_pixels", "max_pixels")


@dataclass
class VisualInputs:
    """Images and videos of one request, as transformers' processor returns them (numpy):
    pixel_values [P, D] + image_grid_thw [Ni, 3], pixel_values_videos + video_grid_thw."""

    pixel_values: np.ndarray | None = None
    image_grid_thw: np.ndarray | None = None
    pixel_values_videos: np.ndarray | None = None
    video_grid_thw: np.ndarray | None = None

    def check_pairs(self) -> None:
        for pv, grid, what in ((self.pixel_values, self.image_grid_thw, "image"),
                               (self.pixel_values_videos, self.video_grid_thw, "video")):
            if (pv is None) != (grid is None):
                raise InputError(f"{what} pixel values and their grid_thw must be given together")

    @property
    def empty(self) -> bool:
        return self.pixel_values is None and self.pixel_values_videos is None


def read_processor_config(directory: str | Path) -> dict | None:
    """The checkpoint's preprocessor_config.json as a dict, or None without one."""
    path = Path(directory) / PREPROCESSOR_FILE
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a readable JSON file ({exc})") from None
    return d if isinstance(d, dict) else None


def make_processor(vision_config, processor_config: dict | None = None):
    """transformers' Qwen2VLImageProcessorPil for `vision_config` (gdn_export.vision_config)."""
    try:
        from transformers import Qwen2VLImageProcessorPil
    except ImportError as exc:
        raise InputError(f"--image needs transformers and Pillow (pip install -e \".[vision]\"): {exc}") from None
    settings = {k: v for k, v in (processor_config or {}).items() if k in _SETTINGS and v is not None}
    return Qwen2VLImageProcessorPil(patch_size=vision_config.patch_size,
                                    temporal_patch_size=vision_config.temporal_patch_size,
                                    merge_size=vision_config.spatial_merge_size, **settings)


def read_image(path: str | Path):
    """A Pillow image, fully decoded, or InputError naming the file."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise InputError("--image needs Pillow (pip install -e \".[vision]\")") from None
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--image {path}: no such file")
    try:
        with Image.open(path) as image:
            image.load()
            return image.copy()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        reason = "not an image Pillow can read" if isinstance(exc, UnidentifiedImageError) else str(exc)
        raise InputError(f"--image {path}: {reason}") from None


def load_images(paths: Sequence[str | Path], vision_config, processor_config: dict | None = None) -> VisualInputs:
    """VisualInputs of the images at `paths` (all read and checked before any is processed)."""
    images = [read_image(p) for p in paths]
    processor = make_processor(vision_config, processor_config)
    out = processor(images=images, return_tensors="np")
    return VisualInputs(np.asarray(out["pixel_values"], np.float32), np.asarray(out["image_grid_thw"], np.int64))


def load_pixel_values(path: str | Path) -> VisualInputs:
    """VisualInputs from a .npz of the processor's output (module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--pixel-values {path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise InputError(f"--pixel-values {path}: not a readable .npz file ({exc})") from None
    known = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
    unknown = sorted(set(arrays) - set(known))
    if unknown:
        raise InputError(f"--pixel-values {path}: unexpected arrays {', '.join(unknown)} (expected "
                         f"{', '.join(known)})")
    visual = VisualInputs(*(arrays.get(k) for k in known))
    if visual.empty:
        raise InputError(f"--pixel-values {path}: holds neither pixel_values nor pixel_values_videos")
    for name in ("pixel_values", "pixel_values_videos"):
        value = arrays.get(name)
        if value is not None and not np.issubdtype(value.dtype, np.floating):
            raise InputError(f"--pixel-values {path}: {name} must be floating point, got {value.dtype}")
    try:
        visual.check_pairs()
    except InputError as exc:
        raise InputError(f"--pixel-values {path}: {exc}") from None
    return visual
