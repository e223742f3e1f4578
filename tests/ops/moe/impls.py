"""Every implementation of the MoE op, as contract-suite parameters: `run(x, case)` returns out [N, H]."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import torch

from tests.ops.impl import HAS_CUDA, Impl

_ARGS = ("hidden", "router_logits", "gate_up", "down")


def _naive(x, case):
    from gdn_export.ops.moe.naive import moe

    return moe(*(x[n] for n in _ARGS), case.top_k, case.norm)


def _op(backend):
    def run(x, case):
        from gdn_export.ops import moe, use_backend

        with use_backend(backend):
            return moe(*(x[n] for n in _ARGS), case.top_k, case.norm)

    return run


def _triton(x, case):
    from kernels.moe.triton.moe import moe

    return moe(*(x[n] for n in _ARGS), case.top_k, case.norm)


def _cuda(x, case):
    from gdn_export.ops.moe import cuda as backend

    return backend.moe(*(x[n] for n in _ARGS), case.top_k, case.norm)


_ELEM = {torch.float32: onnx.TensorProto.FLOAT, torch.float16: onnx.TensorProto.FLOAT16}


@functools.lru_cache(maxsize=None)
def _ort_session(dtype, H, E, I, top_k, norm):  # noqa: E741
    """One gdn.MoE node (N symbolic, expert weights as inputs) through ONNX Runtime's function body;
    the exported node's contract is checked by tests/ops/moe/test_onnx.py."""
    from gdn_export.onnx.schemas import register_schemas
    from gdn_export.ops.moe import FIELD_NORM_TOPK_PROB, FIELD_TOP_K, INPUT_NAMES, OUTPUT_NAMES, PLUGIN_NAME
    from tests.onnx._single_op import ort_session

    register_schemas()
    vi = onnx.helper.make_tensor_value_info
    t = _ELEM[dtype]
    shapes = {"hidden": ["N", H], "router_logits": ["N", E], "gate_up": [E, 2 * I, H], "down": [E, H, I]}
    inputs = [vi(n, t, shapes[n]) for n in INPUT_NAMES]
    node = onnx.helper.make_node(PLUGIN_NAME, list(INPUT_NAMES), list(OUTPUT_NAMES), domain="gdn",
                                 plugin_version="1", plugin_namespace="gdn",
                                 **{FIELD_TOP_K: top_k, FIELD_NORM_TOPK_PROB: int(norm)})
    graph = onnx.helper.make_graph([node], "moe", inputs, [vi(OUTPUT_NAMES[0], t, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18),
                                                        onnx.helper.make_opsetid("gdn", 1)])
    return ort_session(model)


def _ort(x, case):
    from tests.onnx._single_op import run

    (out,) = run(_ort_session(x["hidden"].dtype, case.H, case.E, case.I, case.top_k, case.norm),
                 {n: x[n] for n in _ARGS})
    return torch.from_numpy(np.asarray(out))


_SMALL = lambda case, dtype: "small" in case.tags  # noqa: E731
_ALL = lambda case, dtype: True  # noqa: E731
_TRITON = lambda case, dtype: "small" in case.tags or HAS_CUDA  # noqa: E731
_ORT = lambda case, dtype: "small" in case.tags and dtype != torch.bfloat16 and case.N <= 65  # noqa: E731
_OP = lambda case, dtype: case.name.startswith(("N7-H32", "N65-H16", "decode-B8", "prefill-T300"))  # noqa: E731

IMPLS = [
    Impl("reference", "reference", _naive, _SMALL),
    Impl("op-reference", "reference", _op("reference"), lambda c, d: _OP(c, d) and _SMALL(c, d)),
    Impl("triton", "triton", _triton, _TRITON),
    Impl("op-triton", "triton", _op("triton"), lambda c, d: _OP(c, d) and _TRITON(c, d)),
    Impl("cuda", "cuda", _cuda, _ALL),
    Impl("op-cuda", "cuda", _op("cuda"), _OP),
    Impl("onnxruntime", "onnx", _ort, _ORT),
]
