"""ONNX translations of gdn::kv_cache_update (TensorScatter) and gdn::attention (Attention).

Both are standard ONNX ops, so a graph holding them needs default-domain opset 24 (TensorScatter's
first version); Attention is taken at its opset-23 form (no softcap, no windows, 4-D inputs).
"""

from __future__ import annotations

OPSET = 24  # TensorScatter; Attention is 23


def kv_cache_update_translation(cache, update, write_indices):
    from onnxscript.onnx_opset import opset24 as op

    return op.TensorScatter(cache, update, write_indices, axis=2, mode="linear")


def attention_translation(q, key, value, mask, scale: float):
    from onnxscript.onnx_opset import opset24 as op

    # Only the first output (Y): present_key / present_value belong to the past_key form, which the
    # in-place cache replaces.
    y, *_ = op.Attention(q, key, value, mask, scale=scale)
    return y


def translations() -> dict:
    """{torch op overload: onnxscript translation} for the dynamo exporter."""
    import torch

    import gdn_export.ops.attention  # noqa: F401  (registers the ops)

    return {torch.ops.gdn.kv_cache_update.default: kv_cache_update_translation,
            torch.ops.gdn.attention.default: attention_translation}
