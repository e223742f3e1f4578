"""ONNX translations of the quantized-linear ops: standard QuantizeLinear / DequantizeLinear + MatMul,
in the form TensorRT fuses into quantized GEMMs (Q/DQ on the activation and weight inputs of the
MatMul) and ONNX Runtime's CPU provider runs. Opset >= 21 (FLOAT8E4M3FN / INT4 Q/DQ with
output_dtype and block_size).

    gdn::fp8_linear        x -> QuantizeLinear(input_scale, FLOAT8E4M3FN) -> DequantizeLinear ─┐
                           weight fp8 [N, K] -> Transpose -> DequantizeLinear(weight_scale, axis 1) ─ MatMul (+ bias)
    gdn::fp8_block_linear  weight fp8 [N, K] -> DequantizeLinear(scale rows expanded to [N, ceil(K/128)],
                           axis 1, block_size 128) -> Transpose -> MatMul with the 16-bit x: the
                           published 128 x 128 weights exactly, activations left in 16 bits (TensorRT
                           builds weight-only blockwise DQ; per-token-group FP8 activations are not a
                           Q/DQ form it fuses). The PyTorch model quantizes activations per token group:
                           the ONNX graph differs from it by that rounding (docs/quantization.md).
    gdn::int4_linear       INT4 [K, N] initializer -> DequantizeLinear(scales^T, axis 0, block_size
                           group) -> MatMul with the 16-bit x (W4A16). The translation unpacks the
                           uint8 buffer with standard ops (the exporter hands translations values,
                           not data); `fold_int4_weights`, run by export_onnx, turns each such chain
                           into one INT4 initializer. AWQ's pre_scale: a Mul on x first.

Scales are cast to x's dtype (Q/DQ take the scale in the float type of their float side). Where K is
not a multiple of the block (128 / group_size), the DequantizeLinear block is gcd(K, block) with each
scale repeated: TensorRT's parser takes whole blocks only; the weights stay exactly the same.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

MIN_OPSET = 21
FLOAT8E4M3FN = 17  # onnx.TensorProto.FLOAT8E4M3FN
INT4 = 22  # onnx.TensorProto.INT4
BLOCK = 128


def _op():
    from onnxscript.onnx_opset import opset21 as op

    return op


def fp8_linear_translation(x, weight, weight_scale, input_scale, bias=None):
    op = _op()
    s_in = op.CastLike(input_scale, x)
    xq = op.QuantizeLinear(x, s_in, output_dtype=FLOAT8E4M3FN, saturate=1)
    xd = op.DequantizeLinear(xq, s_in)
    wt = op.Transpose(weight, perm=[1, 0])  # [K, N]
    wd = op.DequantizeLinear(wt, op.CastLike(weight_scale, x), axis=1)
    y = op.MatMul(xd, wd)
    return y if bias is None else op.Add(y, op.CastLike(bias, x))


def _repeat(op, s, axis: int, r: int, keep):
    """2-D s with each slice along `axis` repeated r times, cut to `keep` (an int64 [1] value) along
    it: the scale of a finer block grid (constant-folded at export)."""
    if r == 1:
        return s
    s3 = op.Unsqueeze(s, op.Constant(value_ints=[axis + 1]))
    dims = [op.Shape(s, start=0, end=1), op.Shape(s, start=1, end=2)]
    dims.insert(axis + 1, op.Constant(value_ints=[r]))
    # [-1, cols] for axis 0, [rows, -1] for axis 1 (a 0 in Reshape's shape copies the input's dim, here r)
    flat = (op.Concat(op.Constant(value_ints=[-1]), dims[2], axis=0) if axis == 0
            else op.Concat(dims[0], op.Constant(value_ints=[-1]), axis=0))
    out = op.Reshape(op.Expand(s3, op.Concat(*dims, axis=0)), flat)
    return op.Slice(out, op.Constant(value_ints=[0]), keep, op.Constant(value_ints=[axis]))


def _block(K, group: int) -> int:
    """The DequantizeLinear block size along K: `group` when it divides K, else gcd(K, group) (TensorRT
    takes whole blocks only; each finer block repeats its group's scale, the same weights exactly)."""
    import math

    return group if not isinstance(K, int) or K % group == 0 else math.gcd(K, group)


def fp8_block_linear_translation(x, weight, weight_scale_inv, bias=None):
    op = _op()
    # [Nb, Kb] -> [N, Kb]: each row of blocks repeated 128 times, cut to N rows (constant-folded).
    n = op.Shape(weight, start=0, end=1)
    s = op.CastLike(weight_scale_inv, x)
    s3 = op.Unsqueeze(s, op.Constant(value_ints=[1]))  # [Nb, 1, Kb]
    shape3 = op.Concat(op.Shape(s, start=0, end=1), op.Constant(value_ints=[BLOCK]),
                       op.Shape(s, start=1, end=2), axis=0)
    rows = op.Reshape(op.Expand(s3, shape3), op.Concat(op.Constant(value_ints=[-1]), op.Shape(s, start=1, end=2),
                                                       axis=0))
    rows = op.Slice(rows, op.Constant(value_ints=[0]), n, op.Constant(value_ints=[0]))
    K = weight.shape[1]
    b = _block(K, BLOCK)
    if b != BLOCK:
        rows = _repeat(op, rows, 1, BLOCK // b, op.Constant(value_ints=[K // b]))
    wd = op.DequantizeLinear(weight, rows, axis=1, block_size=b)  # [N, K] in x's dtype
    y = op.MatMul(x, op.Transpose(wd, perm=[1, 0]))
    return y if bias is None else op.Add(y, op.CastLike(bias, x))


def _unpack_int4(op, qweight, K: int):
    """uint8 [N, ceil(K/2)] (low nibble = even k) -> INT4 [N, K] with standard ops; `fold_int4_weights`
    replaces the chain by one INT4 initializer after export."""
    low = op.BitwiseAnd(qweight, op.Cast(op.Constant(value_int=15), to=2))
    high = op.BitShift(qweight, op.Cast(op.Constant(value_int=4), to=2), direction="RIGHT")
    pairs = op.Concat(op.Unsqueeze(low, op.Constant(value_ints=[2])), op.Unsqueeze(high, op.Constant(value_ints=[2])),
                      axis=2)  # [N, K2, 2]
    flat = op.Reshape(pairs, op.Constant(value_ints=[0, -1]))
    nib = op.Cast(op.Slice(flat, op.Constant(value_ints=[0]), op.Constant(value_ints=[K]),
                           op.Constant(value_ints=[1])), to=3)  # int8 0..15
    signed = op.Where(op.GreaterOrEqual(nib, op.Cast(op.Constant(value_int=8), to=3)),
                      op.Sub(nib, op.Cast(op.Constant(value_int=16), to=3)), nib)
    return op.Cast(signed, to=INT4)


def int4_linear_translation(x, qweight, scales, bias=None, group_size: int = 128, pre_scale=None):
    op = _op()
    K = x.shape[-1]
    if not isinstance(K, int):
        K = qweight.shape[1] * 2
    if pre_scale is not None:
        x = op.Mul(x, op.CastLike(pre_scale, x))
    w_t = op.Transpose(_unpack_int4(op, qweight, K), perm=[1, 0])  # INT4 [K, N]
    s_t = op.Transpose(op.CastLike(scales, x), perm=[1, 0])  # [ceil(K/G), N]
    G = int(group_size)
    b = _block(K, G)
    if b != G:
        s_t = _repeat(op, s_t, 0, G // b, op.Constant(value_ints=[K // b]))
    wd = op.DequantizeLinear(w_t, s_t, axis=0, block_size=b)
    y = op.MatMul(x, wd)
    return y if bias is None else op.Add(y, op.CastLike(bias, x))


def signed_int4(source: np.ndarray, lead: tuple[int, ...], K: int) -> np.ndarray:
    """The signed int4 values [*lead, K] from a packed chain's start: the bytes [*lead, ceil(K/2)]
    (low nibble = even k), or the nibble pairs [*lead, ceil(K/2), 2] when the exporter's optimizer
    folded the first steps."""
    u = source.astype(np.uint8)
    if u.ndim == len(lead) + 1:
        u = np.stack(((u & 0x0F), (u >> 4)), axis=-1)
    q = u.reshape(*lead, -1)[..., :K].astype(np.int8)
    return np.where(q >= 8, q - 16, q)


def fold_int4_chains(ir_model, plan: Callable) -> int:
    """Replace the INT4 input of each DequantizeLinear that is computed from a packed uint8
    initializer (an `_unpack_int4` chain) by one INT4 initializer, and drop the dead nodes.

    plan(w) -> None to leave the INT4 value w as it is, else (is_source, values): is_source(v) says
    whether a uint8 initializer v on w's chain is the one it starts from, values(array of v) gives
    w's signed int4 values. Returns how many were folded."""
    import ml_dtypes
    import onnx_ir as ir
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    graph, folded = ir_model.graph, 0
    for node in list(graph):
        if node.op_type != "DequantizeLinear" or node.inputs[0].dtype != ir.DataType.INT4:
            continue
        w = node.inputs[0]
        chosen = None if w.const_value is not None else plan(w)
        if chosen is None:
            continue
        is_source, values = chosen
        source, todo, seen = None, [w.producer()], set()
        while todo:  # the uint8 initializer the chain starts from
            n = todo.pop()
            if n is None or id(n) in seen:
                continue
            seen.add(id(n))
            for v in n.inputs:
                if v is None:
                    continue
                if v.const_value is not None and v.dtype == ir.DataType.UINT8 and is_source(v):
                    source = v
                elif v.producer() is not None:
                    todo.append(v.producer())
        if source is None:
            continue
        q = values(source.const_value.numpy())
        tensor = ir.Tensor(np.ascontiguousarray(q).astype(ml_dtypes.int4), name=f"{source.name}_int4")
        value = ir.Value(name=tensor.name, type=ir.TensorType(ir.DataType.INT4), shape=ir.Shape(tensor.shape),
                         const_value=tensor)
        graph.register_initializer(value)
        node.replace_input_with(0, value)
        folded += 1
    if folded:
        RemoveUnusedNodesPass()(ir_model)
        for name in [n for n, v in graph.initializers.items() if not v.uses() and v.dtype == ir.DataType.UINT8]:
            graph.initializers.pop(name)
    return folded


def fold_int4_weights(ir_model) -> int:
    """Replace each INT4 weight computed from a packed uint8 initializer (the `_unpack_int4` chain,
    then Transpose) by one INT4 [K, N] initializer feeding its DequantizeLinear, and drop the dead
    nodes: TensorRT fuses DequantizeLinear(INT4 initializer) -> MatMul into a W4A16 GEMM. Returns
    how many weights were folded."""

    def plan(w):
        def is_source(v):  # [N, ceil(K/2)] bytes or [N, ceil(K/2), 2] nibble pairs
            return len(v.shape) == 2 or (len(v.shape) == 3 and v.shape[2] == 2)

        return is_source, lambda a: signed_int4(a, (a.shape[0],), w.shape[0]).T

    return fold_int4_chains(ir_model, plan)


def translations() -> dict:
    """{torch op overload: onnxscript translation} for the dynamo exporter."""
    import torch

    import gdn_export.ops.quant_linear  # noqa: F401  (registers the ops)

    return {torch.ops.gdn.fp8_linear.default: fp8_linear_translation,
            torch.ops.gdn.fp8_block_linear.default: fp8_block_linear_translation,
            torch.ops.gdn.int4_linear.default: int4_linear_translation}
