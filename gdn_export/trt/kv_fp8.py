"""Whether the TensorRT in use builds an FP8 K/V cache graph (gdn_export.kv_cache_format "fp8").

TensorRT-RTX 1.7.1 (tensorrt_rtx 1.7.1.116, the CPU-only build here) refuses it in the ONNX parser:
its KV_CACHE_UPDATE layer (ONNX TensorScatter) takes FLOAT / HALF / BF16 caches only ("cache has
type FP8 but must have type Float, Half, or BFloat16", measured on a Q -> TensorScatter(FLOAT8E4M3FN)
-> DQ -> Attention graph). `check` says so by name before any build work. Other TensorRT releases
are let through: their parser names the node if it refuses the cache.
"""

from __future__ import annotations

import importlib

from gdn_export.errors import GdnExportError
from gdn_export.onnx.metadata import KEY_KV_CACHE_FORMAT

# (module, newest version known to refuse an FP8 KV_CACHE_UPDATE cache)
REFUSED = {"tensorrt_rtx": (1, 7)}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


def check(onnx_path, metadata: dict, flavour: str) -> None:
    """GdnExportError naming the TensorRT version when the graph has an FP8 K/V cache that this
    TensorRT cannot build; nothing otherwise."""
    if metadata.get(KEY_KV_CACHE_FORMAT) != "fp8":
        return
    newest = REFUSED.get(flavour)
    if newest is None:
        return
    version = importlib.import_module(flavour).__version__
    if _version(version) <= newest:
        raise GdnExportError(f"{onnx_path}: has an FP8 K/V cache ({KEY_KV_CACHE_FORMAT} fp8), which {flavour} "
                             f"{version} cannot build (its KV cache update takes float / half / bf16 caches "
                             f"only); export the checkpoint without an FP8 K/V cache for TensorRT (quantize "
                             f"without --kv-cache fp8), or run it in ONNX Runtime")
