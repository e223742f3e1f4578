"""What the ort form folds into ONNX Runtime's ops, found in the exported gdn graph.

The exporter writes the Gated DeltaNet gates and output norm as standard ops around the gdn nodes
(gdn_export.modules.gated_deltanet, gdn_export.modules.norm); `match_gate`, `match_beta` and
`match_norm` recognise exactly those chains and return what the fused ops take instead:

    g     = Where(mask, C * softplus(a32 + dt_bias), 0)      C = -exp(A_log), a constant [Hv]
            softplus as torch exports it: Where(x > 20, x, Softplus(x)) (or a bare Softplus)
            a32 = a, or Cast(a -> fp32) of a 16-bit a
    beta  = Where(mask, Sigmoid(b), 0)
    y     = [Cast T](x32 * rsqrt(mean(x32^2) + eps) * w * (z32 * Sigmoid(z32)))
            x32 = o or Cast(o -> fp32), z32 = z or Cast(z -> fp32), w a constant [Dv]

Anything else (another beta such as OLMo-Hybrid's 2 sigmoid(b), an edited graph) matches nothing
and stays as it is: the caller then feeds the op the computed g / beta / o. The matchers only read
the graph; the rewrite removes the gdn node and the norm's last node, and what no longer feeds
anything (gdn_export.onnx.ort_form.prune) goes with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

SOFTPLUS_THRESHOLD = 20.0  # torch.nn.functional.softplus: x when x > 20


class GraphIndex:
    """Producers, consumers and constants of a GraphProto (the rewrite's read-only view)."""

    def __init__(self, graph: onnx.GraphProto, base_dir: str | Path | None = None):
        self.producer = {o: n for n in graph.node for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.initializers = {t.name: t for t in graph.initializer}
        self.outputs = {v.name for v in graph.output}
        self.base_dir = None if base_dir is None else str(base_dir)

    def op(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The default-domain node of `op_type` producing `name`, or None."""
        n = self.producer.get(name)
        return n if n is not None and n.op_type == op_type and n.domain in ("", "ai.onnx") else None

    def const(self, name: str) -> np.ndarray | None:
        """The value of `name` when it is an initializer, a Constant, or a Cast / Identity of one."""
        if name in self.initializers:
            t = self.initializers[name]
            if t.data_location == TensorProto.EXTERNAL:
                if self.base_dir is None:
                    return None
                t = onnx.TensorProto.FromString(t.SerializeToString())
                onnx.external_data_helper.load_external_data_for_tensor(t, self.base_dir)
            return numpy_helper.to_array(t)
        n = self.producer.get(name)
        if n is None:
            return None
        if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value":
            return numpy_helper.to_array(n.attribute[0].t)
        if n.op_type in ("Cast", "Identity"):
            x = self.const(n.input[0])
            if x is None or n.op_type == "Identity":
                return x
            to = next(a.i for a in n.attribute if a.name == "to")
            return x.astype(onnx.helper.tensor_dtype_to_np_dtype(to)) if to != TensorProto.BFLOAT16 else None
        return None

    def uncast(self, name: str) -> str:
        """The input of a Cast(to=FLOAT) producing `name`, else `name`."""
        n = self.op(name, "Cast")
        if n is not None and any(a.name == "to" and a.i == TensorProto.FLOAT for a in n.attribute):
            return n.input[0]
        return name


def _is(value, want: float) -> bool:
    return value is not None and value.size == 1 and float(value.reshape(())) == want


def _operands(G: GraphIndex, node: onnx.NodeProto):
    """(constant value, other input) of a binary node with one constant operand, else (None, None)."""
    for c, x in (node.input, reversed(node.input)):
        value = G.const(c)
        if value is not None and G.const(x) is None:
            return value, x
    return None, None


def _masked(G: GraphIndex, name: str):
    """(mask, x) of Where(mask, x, 0), (None, name) when `name` is not such a Where."""
    n = G.op(name, "Where")
    if n is not None and _is(G.const(n.input[2]), 0.0):
        return n.input[0], n.input[1]
    return None, name


def _softplus_arg(G: GraphIndex, name: str) -> str | None:
    """x of softplus(x) as torch exports it, else None."""
    n = G.op(name, "Softplus")
    if n is not None:
        return n.input[0]
    w = G.op(name, "Where")
    if w is None:
        return None
    gt, sp = G.op(w.input[0], "Greater"), G.op(w.input[2], "Softplus")
    x = w.input[1]
    if gt is None or sp is None or gt.input[0] != x or sp.input[0] != x \
            or not _is(G.const(gt.input[1]), SOFTPLUS_THRESHOLD):
        return None
    return x


@dataclass(frozen=True)
class Gate:
    """g = Where(mask, -exp(a_log) softplus(a + dt_bias), 0): `a` the raw projection (model dtype
    or fp32), `a_log` / `dt_bias` fp32 [Hv], `mask` [B, T, 1] bool or None."""

    mask: str | None
    a: str
    a_log: np.ndarray
    dt_bias: np.ndarray


def match_gate(G: GraphIndex, g: str, heads: int) -> Gate | None:
    """The gate chain producing `g` [B, T, heads], or None."""
    mask, x = _masked(G, g)
    mul = G.op(x, "Mul")
    if mul is None:
        return None
    scale, sp = _operands(G, mul)
    if scale is None or scale.size != heads or not np.all(scale < 0):
        return None
    arg = _softplus_arg(G, sp)
    add = G.op(arg, "Add") if arg is not None else None
    if add is None:
        return None
    dt_bias, a32 = _operands(G, add)
    if dt_bias is None or dt_bias.size != heads:
        return None
    a_log = np.log(-scale.astype(np.float64).reshape(heads)).astype(np.float32)
    return Gate(mask, G.uncast(a32), a_log, dt_bias.astype(np.float32).reshape(heads))


@dataclass(frozen=True)
class Beta:
    """beta = Where(mask, Sigmoid(b), 0): `b` the raw projection."""

    mask: str | None
    b: str


def match_beta(G: GraphIndex, beta: str) -> Beta | None:
    mask, x = _masked(G, beta)
    sig = G.op(x, "Sigmoid")
    return None if sig is None else Beta(mask, sig.input[0])


@dataclass(frozen=True)
class Norm:
    """y = rmsnorm(o) * w * silu(z) over the last axis: `z` (o's dtype), `weight` the fp32
    tensor w [Dv] and its values, `eps`, `y` the chain's output tensor and `last` its producer."""

    z: str
    weight: str
    weight_values: np.ndarray
    eps: float
    y: str
    last: onnx.NodeProto


def _single(G: GraphIndex, name: str, op_type: str):
    users = G.consumers.get(name, [])
    if len(users) != 1 or users[0].op_type != op_type or name in G.outputs:
        return None
    return users[0]


def match_norm(G: GraphIndex, o: str, o_type: int) -> Norm | None:
    """The gated RMSNorm reading the gdn node's output `o` (elem type `o_type`), or None."""
    x = o
    if o_type != TensorProto.FLOAT:
        cast = _single(G, o, "Cast")
        if cast is None:
            return None
        x = cast.output[0]
    users = G.consumers.get(x, [])
    pow_ = next((n for n in users if n.op_type == "Pow"), None)
    mul_x = next((n for n in users if n.op_type == "Mul"), None)
    if len(users) != 2 or pow_ is None or mul_x is None or not _is(G.const(pow_.input[1]), 2.0):
        return None
    mean = _single(G, pow_.output[0], "ReduceMean")
    if mean is None or not _reduces_last_axis(G, mean):
        return None
    add = _single(G, mean.output[0], "Add")
    eps, _ = _operands(G, add) if add is not None else (None, None)
    sqrt = _single(G, add.output[0], "Sqrt") if eps is not None and eps.size == 1 else None
    rec = _single(G, sqrt.output[0], "Reciprocal") if sqrt is not None else None
    if rec is None or set(mul_x.input) != {x, rec.output[0]}:
        return None
    mul_w = _single(G, mul_x.output[0], "Mul")
    weight, _ = _operands(G, mul_w) if mul_w is not None else (None, None)
    mul_z = _single(G, mul_w.output[0], "Mul") if weight is not None else None
    if mul_z is None:
        return None
    silu = G.op(next(i for i in mul_z.input if i != mul_w.output[0]), "Mul")
    sig = None if silu is None else next((G.op(i, "Sigmoid") for i in silu.input
                                          if G.op(i, "Sigmoid") is not None), None)
    if sig is None or set(silu.input) != {sig.input[0], sig.output[0]}:
        return None
    last = mul_z
    if o_type != TensorProto.FLOAT:
        last = _single(G, mul_z.output[0], "Cast")
        if last is None or not any(a.name == "to" and a.i == o_type for a in last.attribute):
            return None
    w_name = next(i for i in mul_w.input if i != mul_x.output[0])
    return Norm(G.uncast(sig.input[0]), w_name, weight.reshape(-1), float(eps.reshape(())), last.output[0], last)


def _reduces_last_axis(G: GraphIndex, mean: onnx.NodeProto) -> bool:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in mean.attribute}
    if attrs.get("keepdims", 1) != 1:
        return False
    axes = G.const(mean.input[1]) if len(mean.input) > 1 else np.asarray(attrs.get("axes", []))
    return axes is not None and axes.size == 1 and int(axes.reshape(())) in (-1, 3)
