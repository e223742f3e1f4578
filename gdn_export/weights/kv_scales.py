"""FP8 K/V cache scales in a checkpoint (ModelOpt's unified Hugging Face form, as vLLM reads it).

A checkpoint whose quantization_config asks for an FP8 K/V cache (`kv_cache_scheme` {"num_bits": 8,
"type": "float"} or `kv_cache_quant_algo` "FP8") stores, for every attention layer i,

    model.layers.{i}.self_attn.k_proj.k_scale    fp32 / bf16 / fp16, shape () or (1,), finite, > 0
    model.layers.{i}.self_attn.v_proj.v_scale    likewise

(the family's checkpoint names: model.language_model.layers... for the composite Qwen3.5 layout).
The cache then stores K / scale and V / scale in float8_e4m3fn (gdn_export.modules.kv_cache_fp8).
A missing, mis-shaped, non-float or non-positive scale is a one-line CheckpointError naming the key;
so are such tensors in a checkpoint that asks for no FP8 cache, and a request for one in a model
without attention layers.
"""

from __future__ import annotations

import math

from gdn_export.errors import CheckpointError
from gdn_export.modules.kv_cache_fp8 import attention_layers

SCALE_DTYPES = ("F32", "BF16", "F16")
SUFFIXES = (".k_scale", ".v_scale")


def wants_fp8(spec) -> bool:
    """Whether a parsed quantization_config (gdn_export.weights.quantized.QuantSpec or None) asks
    for an FP8 K/V cache."""
    return spec is not None and getattr(spec, "kv_cache", None) == "fp8"


def scale_keys(model, config, family) -> dict[int, tuple[str, str]]:
    """{attention layer: (k_scale key, v_scale key)} in the checkpoint's names."""
    out = {}
    for i in sorted(attention_layers(model)):
        base = f"model.layers.{i}.self_attn"
        k = family.checkpoint_name(f"{base}.k_proj.weight", config)[: -len("weight")] + "k_scale"
        v = family.checkpoint_name(f"{base}.v_proj.weight", config)[: -len("weight")] + "v_scale"
        out[i] = (k, v)
    return out


def plan(model, config, family, spec, reader) -> dict[int, tuple[str, str]]:
    """Check the scales' presence, dtypes and shapes from the headers; {} when the checkpoint asks
    for no FP8 cache. CheckpointError names the first bad key."""
    keys = scale_keys(model, config, family)
    if not wants_fp8(spec):
        stray = sorted(k for k in reader.shapes if k.endswith(SUFFIXES))
        if stray:
            raise CheckpointError(f"tensor {stray[0]} is an FP8 K/V cache scale, but config.json's "
                                  f"quantization_config asks for no FP8 K/V cache (kv_cache_scheme)")
        return {}
    if not keys:
        raise CheckpointError("config.json asks for an FP8 K/V cache (kv_cache_scheme), but the model has no "
                              "attention layers")
    for i, pair in keys.items():
        for key in pair:
            if key not in reader.shapes:
                raise CheckpointError(f"tensor {key} is missing from the checkpoint (FP8 K/V cache scale of "
                                      f"attention layer {i})")
            if reader.dtypes[key] not in SCALE_DTYPES:
                raise CheckpointError(f"tensor {key} is {reader.dtypes[key]}, expected "
                                      f"{' or '.join(SCALE_DTYPES)} (FP8 K/V cache scale)")
            if tuple(reader.shapes[key]) not in ((), (1,)):
                raise CheckpointError(f"tensor {key} has shape {tuple(reader.shapes[key])} in the checkpoint, "
                                      f"expected () (one FP8 K/V cache scale per tensor)")
    wanted = {k for pair in keys.values() for k in pair}
    stray = sorted(k for k in reader.shapes if k.endswith(SUFFIXES) and k not in wanted)
    if stray:
        raise CheckpointError(f"tensor {stray[0]} belongs to no attention layer's K/V cache")
    return keys


def read(reader, keys: dict[int, tuple[str, str]]) -> dict[int, tuple[float, float]]:
    """{layer: (k_scale, v_scale)} read from the checkpoint; CheckpointError names a scale that is
    not finite and > 0."""
    out = {}
    for i, pair in keys.items():
        values = []
        for key in pair:
            v = float(reader.get(key).float().reshape(()))
            if not (math.isfinite(v) and v > 0):
                raise CheckpointError(f"tensor {key} is {v}: an FP8 K/V cache scale must be finite and > 0")
            values.append(v)
        out[i] = (values[0], values[1])
    return out
