"""FP8 K/V cache calibration (`gdn-export quantize --kv-cache fp8`): per attention layer, the amax of
what the cache stores, K after k_norm and RoPE and V after v_proj, over the calibration pass;
k_scale = amax_k / 448, v_scale = amax_v / 448 (per tensor, static; FP8 E4M3's largest finite 448).

Why not ModelOpt's KV-cache config (`*[kv]_bmm_quantizer`): ModelOpt 0.47 inserts those quantizers
only into attention classes it can rewrite, namely transformers' attention modules of a
PreTrainedModel (plugins.huggingface.register_hf_attentions_on_the_fly) or classes whose source
calls matmul / bmm / scaled_dot_product_attention on K and V (plugins.attention). Our attention
layers run K and V through the gdn::kv_cache_update / gdn::attention custom ops (the in-place cache
and the ONNX Attention node), so ModelOpt finds no K / V product to wrap and would calibrate no
K/V scale. Here the layer's `project` (which returns the normed, rotated K and V) is wrapped for the
duration of the same calibration pass that ModelOpt runs for the Linears; the scales ModelOpt would
export are the same amax / 448 (its unified export names them k_proj.k_scale / v_proj.v_scale,
which gdn_export.quantize.writer follows; ModelOpt additionally clamps them to >= 1 by default,
which we do not: a tiny model's K would then round to a handful of e4m3 steps).
"""

from __future__ import annotations

import contextlib

import torch

from gdn_export.errors import GdnExportError
from gdn_export.modules.kv_cache_fp8 import attention_layers

FP8_MAX = 448.0
MIN_AMAX = 1e-6  # a layer whose K or V never left 0 gets this amax (the scale must be > 0)


@contextlib.contextmanager
def record_kv_amax(model):
    """Within the block, every forward of model's attention layers records the running amax of K
    (after k_norm and RoPE) and V (after v_proj), real tokens only. Yields {layer: [amax_k,
    amax_v]} (python floats, filled as the block runs). GdnExportError for a model without
    attention layers."""
    layers = attention_layers(model)
    if not layers:
        raise GdnExportError("--kv-cache fp8: the model has no attention layers (no K/V cache to quantize)")
    amax = {i: [0.0, 0.0] for i in layers}

    def wrap(i, project):
        def recorded(x, cos, sin):
            q, k, v, gate = project(x, cos, sin)
            amax[i][0] = max(amax[i][0], float(k.detach().abs().amax()))
            amax[i][1] = max(amax[i][1], float(v.detach().abs().amax()))
            return q, k, v, gate
        return recorded

    for i, m in layers.items():
        m.project = wrap(i, m.project)  # an instance attribute over the class method
    try:
        yield amax
    finally:
        for m in layers.values():
            m.__dict__.pop("project", None)


def scales_from_amax(amax: dict[int, list[float]]) -> dict[int, tuple[float, float]]:
    """{layer: (k_scale, v_scale)} = max(amax, MIN_AMAX) / 448; GdnExportError when a layer saw no
    token (the calibration never ran it) or a non-finite value."""
    out = {}
    for i, (ak, av) in amax.items():
        if not (torch.isfinite(torch.tensor([ak, av])).all()):
            raise GdnExportError(f"--kv-cache fp8: attention layer {i} saw non-finite K / V during calibration")
        out[i] = (max(ak, MIN_AMAX) / FP8_MAX, max(av, MIN_AMAX) / FP8_MAX)
    return out
