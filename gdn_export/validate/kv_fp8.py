"""validate's tolerance for the cache states of an FP8 K/V cache graph (metadata
gdn_export.kv_cache_format "fp8", gdn_export.kv_cache_scales {layer: [k_scale, v_scale]}).

The cache states compared are e4m3 codes: the cached K / V divided by the layer's scale. Two
allowances, in those units:
* the dtype's absolute tolerance of a K / V value, atol / scale (a model-dtype cache is compared
  with atol on the values themselves): ONNX Runtime and PyTorch compute K and V in other orders, and
  an element near 0 carries the absolute error of its row (k_norm, RoPE mix the row), many codes
  where e4m3's codes are dense;
* one e4m3 code of the value, 2^-3 relative (3 mantissa bits), for a value on a rounding boundary.
Measured on the tiny qwen3_5, bf16 graphs, seeds 0-2 (k_scale 0.0072, v_scale 0.0014): int4-awq up
to 5 codes apart near 0 and max abs 32 at |code| 384 (one code), logits max abs 0.069 (bf16's atol
0.08); fp8 weights (FP8 activations flip too; docs/quantization.md, "Validation": floors 1.0 / 0.3 for 16-bit
graphs, which then hold the cache as loosely as every other state) max abs 48 / 56 codes, 0.35 /
0.08 in K / V units; fp32 graphs: equal code for code. With static FP8 activations the second
bound of gdn_export.validate.compare.Tolerances (one e4m3 rounding step of an activation) is
converted the same way.
"""

from __future__ import annotations

import json

from gdn_export.onnx.metadata import KEY_KV_CACHE_FORMAT, KEY_KV_CACHE_SCALES

ONE_CODE_RTOL = 2.0**-3


def raise_cache_tolerances(runners, tolerances) -> None:
    """Per-tensor (atol, rtol) of every key / value state set to (atol / scale, max(rtol, 2^-3)) from
    the tensor's (atol, rtol) in value units (the dtype's default, as for every other state), and
    its step bound likewise, when a runner's graph has an FP8 K/V cache; tensors the user named
    (--atol / --rtol NAME:VALUE) keep theirs."""
    for runner in runners:
        meta = getattr(runner, "metadata", {})
        if meta.get(KEY_KV_CACHE_FORMAT) != "fp8":
            continue
        scales = {int(k): v for k, v in json.loads(meta.get(KEY_KV_CACHE_SCALES, "{}")).items()}
        for spec in runner.state_specs:
            if spec.kind in ("key", "value") and spec.name not in tolerances.per_tensor and spec.layer in scales:
                scale = scales[spec.layer][0 if spec.kind == "key" else 1]
                atol, rtol = tolerances.get(spec.name)
                tolerances.per_tensor[spec.name] = (atol / scale, max(rtol, ONE_CODE_RTOL))
                step = tolerances.get_step(spec.name)
                if step is not None:
                    tolerances.step_per_tensor[spec.name] = (step[0] / scale, max(step[1], ONE_CODE_RTOL))
