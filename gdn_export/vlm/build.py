"""TensorRT engines of a vision-language export: the language engine's visual-input ranges and the
vision engine's profile, both from the image sizes the user names.

    --image-sizes 448x448,1024x1024 --max-images N

Each WIDTHxHEIGHT is mapped to its patch grid as transformers' Qwen3.5 image processor resizes it
(`smart_resize`: both sides rounded to multiples of patch x merge, within the processor's pixel
budget; settings from the vision file's recorded preprocessor config, else the processor's
defaults). The vision engine's one profile spans pixel_values rows from the smallest size's
patches (opt: the largest's) to max_images x the largest's, and grid_thw rows 1..max_images (opt 1).
The language engine's visual_embeds / visual_index rows span 0 (decode, text) to max_images x the
largest size's merged tokens (opt: the largest's), in both of its profiles.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from gdn_export.errors import GdnExportError

_SIZE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")
DEFAULT_IMAGE_SIZES = "448x448"


def parse_image_sizes(text: str) -> list[tuple[int, int]]:
    """"448x448,1024x768" -> [(448, 448), (1024, 768)] (width, height), or GdnExportError."""
    sizes = []
    for item in text.split(","):
        m = _SIZE.match(item)
        if m is None or int(m[1]) < 1 or int(m[2]) < 1:
            raise GdnExportError(f"--image-sizes {text!r}: {item.strip()!r} is not WIDTHxHEIGHT (e.g. 448x448)")
        sizes.append((int(m[1]), int(m[2])))
    return sizes


def _processor_pixels(processor_config: dict | None) -> tuple[int, int]:
    """(min_pixels, max_pixels) of the image processor (its defaults unless configured)."""
    size = (processor_config or {}).get("size") or {}
    lo = (processor_config or {}).get("min_pixels") or size.get("shortest_edge") or 56 * 56
    hi = (processor_config or {}).get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280
    return int(lo), int(hi)


def patch_grid(width: int, height: int, vision_config, processor_config: dict | None = None) -> tuple[int, int]:
    """(h, w) patches of an image of width x height after the processor's resize."""
    factor = vision_config.patch_size * vision_config.spatial_merge_size
    lo, hi = _processor_pixels(processor_config)
    try:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    except ImportError:
        raise GdnExportError("--image-sizes needs transformers (its image processor's resize rule)") from None
    try:
        h, w = smart_resize(height, width, factor=factor, min_pixels=lo, max_pixels=hi)
    except ValueError as exc:
        raise GdnExportError(f"image size {width}x{height}: {exc}") from None
    return h // vision_config.patch_size, w // vision_config.patch_size


def read_vision_file(path: str | Path):
    """(VisionConfig, processor config or None, metadata) recorded in a vision file."""
    import onnx

    from gdn_export.vlm import export as vx
    from gdn_export.vision_config import VisionConfig

    proto = onnx.load(str(path), load_external_data=False)
    meta = {p.key: p.value for p in proto.metadata_props}
    if meta.get(vx.KEY_ROLE) != "vision":
        raise GdnExportError(f"{path}: not the vision graph of a gdn-export vision-language export")
    processor = json.loads(meta[vx.KEY_PREPROCESSOR]) if vx.KEY_PREPROCESSOR in meta else None
    return VisionConfig(**json.loads(meta[vx.KEY_CONFIG])), processor, meta


def visual_ranges(vision_path, sizes: list[tuple[int, int]], max_images: int) -> dict:
    """{"patches": (min, opt, max), "grids": (...), "tokens": (...), "patch_dim": D, "hidden": H}."""
    if isinstance(max_images, bool) or not isinstance(max_images, int) or max_images < 1:
        raise GdnExportError(f"--max-images must be an integer >= 1, got {max_images!r}")
    config, processor, meta = read_vision_file(vision_path)
    patches = sorted(h * w for h, w in (patch_grid(W, H, config, processor) for W, H in sizes))
    merge = config.merge_unit
    return {"patches": (patches[0], patches[-1], max_images * patches[-1]),
            "grids": (1, 1, max_images),
            "tokens": (0, patches[-1] // merge, max_images * patches[-1] // merge),
            "patch_dim": config.patch_dim, "hidden": int(meta["gdn_export.vlm.hidden_size"])}


def language_shapes(ranges: dict) -> tuple[dict, dict, dict]:
    """min / opt / max shape specs of the language graph's visual_embeds and visual_index."""
    from gdn_export.vlm.export import VISUAL_EMBEDS, VISUAL_INDEX

    out = []
    for i in range(3):
        n = ranges["tokens"][i]
        out.append({VISUAL_EMBEDS: (n, ranges["hidden"]), VISUAL_INDEX: (n,)})
    return tuple(out)


def vision_shapes(ranges: dict) -> tuple[dict, dict, dict]:
    """min / opt / max shape specs of the vision graph."""
    from gdn_export.vlm.export import GRID_THW, PIXEL_VALUES

    return tuple({PIXEL_VALUES: (ranges["patches"][i], ranges["patch_dim"]), GRID_THW: (ranges["grids"][i], 3)}
                 for i in range(3))


def build_vlm(onnx_path, engine_path, *, image_sizes: str = DEFAULT_IMAGE_SIZES, max_images: int = 1,
              plugins=None, min_shapes=None, opt_shapes=None, max_shapes=None, progress=None,
              overwrite: bool = True, **build_kwargs) -> tuple[Path, Path]:
    """Build the language engine `engine_path` from a vision-language model.onnx and the vision
    engine `<stem>.vision.engine` from model.vision.onnx beside it (module docstring); user shape
    specs (dicts, as build_engine takes them) win over the visual defaults."""
    from gdn_export.trt.build import build_engine
    from gdn_export.vlm.export import vision_path

    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    vpath = vision_path(onnx_path)
    if not vpath.is_file():
        raise GdnExportError(f"{vpath}: the vision file of {onnx_path.name} is missing (export writes both)")
    vengine = engine_path.with_name(engine_path.name.removesuffix(".engine") + ".vision.engine")
    ranges = visual_ranges(vpath, parse_image_sizes(image_sizes), max_images)
    say = progress or (lambda _m: None)
    mins, opts, maxs = language_shapes(ranges)
    specs = [dict(mins, **(min_shapes or {})), dict(opts, **(opt_shapes or {})), dict(maxs, **(max_shapes or {}))]
    vmin, vopt, vmax = vision_shapes(ranges)
    say(f"vision engine: {ranges['patches'][0]}..{ranges['patches'][2]} patches, 1..{max_images} images")
    existed = vengine.exists()
    build_engine(vpath, vengine, plugins=plugins, min_shapes=vmin, opt_shapes=vopt, max_shapes=vmax,
                 workspace=build_kwargs.get("workspace"), progress=progress, overwrite=overwrite)
    say(f"language engine: visual rows {ranges['tokens'][0]}..{ranges['tokens'][2]} for image sizes "
        f"{image_sizes} x {max_images}")
    try:
        build_engine(onnx_path, engine_path, plugins=plugins, min_shapes=specs[0], opt_shapes=specs[1],
                     max_shapes=specs[2], progress=progress, overwrite=overwrite, **build_kwargs)
    except BaseException:
        if not existed:  # the pair is built together or not at all
            from gdn_export.trt.build import layers_path

            vengine.unlink(missing_ok=True)
            layers_path(vengine).unlink(missing_ok=True)
        raise
    return engine_path, vengine
