"""ONNX translations of gdn::kv_cache_update (TensorScatter) and gdn::attention (Attention), and of
the FP8 cache's gdn::kv_quantize (QuantizeLinear) / gdn::kv_dequantize (DequantizeLinear).

Both are standard ONNX ops, so a graph holding them needs default-domain opset 24 (TensorScatter's
first version); Attention is taken at its opset-23 form (no softcap, no windows, 4-D inputs).
"""

from __future__ import annotations

OPSET = 24  # TensorScatter; Attention is 23
FLOAT = 1  # onnx.TensorProto.FLOAT
FLOAT8E4M3FN = 17  # onnx.TensorProto.FLOAT8E4M3FN


def kv_cache_update_translation(cache, update, write_indices):
    from onnxscript.onnx_opset import opset24 as op

    return op.TensorScatter(cache, update, write_indices, axis=2, mode="linear")


def attention_translation(q, key, value, mask, scale: float):
    from onnxscript.onnx_opset import opset24 as op

    # Only the first output (Y): present_key / present_value belong to the past_key form, which the
    # in-place cache replaces.
    y, *_ = op.Attention(q, key, value, mask, scale=scale)
    return y


def kv_quantize_translation(x, scale: float):
    """Cast(FLOAT) -> QuantizeLinear with an fp32 scalar scale (an initializer) to FLOAT8E4M3FN,
    saturating: x / scale in fp32, as gdn::kv_quantize."""
    from onnxscript.onnx_opset import opset24 as op

    s = op.Constant(value_float=float(scale))
    return op.QuantizeLinear(op.Cast(x, to=FLOAT), s, output_dtype=FLOAT8E4M3FN, saturate=1)


def kv_dequantize_translation(q, scale: float, dtype):
    """DequantizeLinear (fp32 scalar scale) -> Cast to dtype: q * scale in fp32, rounded once."""
    import torch
    from onnxscript.onnx_opset import opset24 as op

    s = op.Constant(value_float=float(scale))
    y = op.DequantizeLinear(q, s)
    # the exporter hands dtype over as an ONNX data type (onnx_ir.DataType); a torch dtype when called directly
    onnx_dtype = ({torch.float32: FLOAT, torch.float16: 10, torch.bfloat16: 16}[dtype]
                  if isinstance(dtype, torch.dtype) else int(dtype))
    return y if onnx_dtype == FLOAT else op.Cast(y, to=onnx_dtype)


def translations() -> dict:
    """{torch op overload: onnxscript translation} for the dynamo exporter."""
    import torch

    import gdn_export.ops.attention  # noqa: F401  (registers the ops)

    import gdn_export.ops.attention.kv_fp8  # noqa: F401  (registers the FP8 cache ops)

    return {torch.ops.gdn.kv_cache_update.default: kv_cache_update_translation,
            torch.ops.gdn.attention.default: attention_translation,
            torch.ops.gdn.kv_quantize.default: kv_quantize_translation,
            torch.ops.gdn.kv_dequantize.default: kv_dequantize_translation}
