"""Every implementation of the gated delta rule, as contract-suite parameters.

Each `run(x, case)` takes make_inputs' dict on the implementation's device and returns (o,
final_state). Functional entries write into NaN-poisoned buffers where the entry takes them (out=,
final_state=); in-place entries (`inplace` in extra) return the state tensor they were given.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import torch

from tests.ops.impl import HAS_CUDA, Impl, poisoned
from tests.plugins import host_reference

_ARGS = ("q", "k", "v", "g", "beta")


def _args(x):
    return [x[n] for n in _ARGS]


def _outputs(x, case):
    o = poisoned(tuple(x["v"].shape), x["v"].dtype, x["v"].device)
    s = poisoned((case.N, case.Hv, case.Dk, case.Dv), case.state_dtype, x["v"].device)
    return o, s


# ------------------------------------------------------------------------------------ references


def _naive(form):
    def run(x, case):
        from gdn_export.ops.gated_delta_rule import naive

        fn = naive.recurrent_gated_delta_rule if form == "recurrent" else naive.chunked_gated_delta_rule
        return fn(*_args(x), x["initial_state"], case.scale, case.l2norm, x["cu_seqlens"])

    return run


def _op(backend, inplace=False):
    def run(x, case):
        from gdn_export.ops import gated_delta_rule, use_backend
        from gdn_export.ops.gated_delta_rule import gated_delta_rule_

        with use_backend(backend):
            if inplace:
                state = x["initial_state"]
                o = gated_delta_rule_(*_args(x), state, case.scale, case.l2norm)
                return o, state
            return gated_delta_rule(*_args(x), x["initial_state"], case.scale, case.l2norm, x["cu_seqlens"])

    return run


# ------------------------------------------------------------------------------------------ triton


def _triton(kernel, inplace=False, form=None):
    def run(x, case):
        from kernels.gated_delta_rule.triton.chunk import chunk_gated_delta_rule
        from kernels.gated_delta_rule.triton.fused_recurrent import fused_recurrent_gated_delta_rule

        o, s = _outputs(x, case)
        if inplace:
            state = x["initial_state"]
            o_out, s_out = fused_recurrent_gated_delta_rule(*_args(x), state, case.scale, case.l2norm,
                                                            x["cu_seqlens"], inplace=True, out=o)
            assert s_out is state
        else:
            fn = chunk_gated_delta_rule if kernel == "chunk" else fused_recurrent_gated_delta_rule
            kw = {"form": form} if form else {}
            o_out, s_out = fn(*_args(x), x["initial_state"], case.scale, case.l2norm, x["cu_seqlens"],
                              out=o, final_state=s, **kw)
            assert s_out.data_ptr() == s.data_ptr(), "final_state= was not written in place"
        assert o_out.data_ptr() == o.data_ptr(), "out= was not written in place"
        return o_out, s_out

    return run


# -------------------------------------------------------------------------------------------- cuda

PATHS = {"auto": 0, "recurrent": 1, "chunked": 2}  # gdn_export.ops.gated_delta_rule.cuda.PATH_*


def _cuda(path):
    def run(x, case):
        from gdn_export.ops.gated_delta_rule import cuda as backend

        o, s = _outputs(x, case)
        scale = case.Dk ** -0.5 if case.scale is None else case.scale
        backend.gated_delta_rule_out(*_args(x), x["initial_state"], scale, case.l2norm, x["cu_seqlens"], o, s,
                                     path=PATHS[path])
        return o, s

    return run


def _cuda_inplace(x, case):
    from gdn_export.ops.gated_delta_rule import cuda as backend

    state = x["initial_state"]
    scale = case.Dk ** -0.5 if case.scale is None else case.scale
    o = backend.gated_delta_rule_inplace(*_args(x), state, scale, case.l2norm, x["cu_seqlens"])
    return o, state


# ------------------------------------------------------------------------------------ ONNX Runtime

_ELEM = {torch.float32: onnx.TensorProto.FLOAT, torch.float16: onnx.TensorProto.FLOAT16,
         torch.bfloat16: onnx.TensorProto.BFLOAT16}


@functools.lru_cache(maxsize=None)
def _ort_session(dtype, state_dtype, Dk, scale, l2norm, form="gdn", heads=("Hk", "Hv", "Dv")):
    """One gdn.GatedDeltaRule node (every dim symbolic but Dk and `heads`) run by ONNX Runtime
    through the node's function body (gdn_export.onnx.attach_reference_functions), or ("ort", with
    static heads (Hk, Hv, Dv)) rewritten to the ort form's GatedDeltaNet block
    (gdn_export.onnx.ort_form): what the exporter emits for the op, whose node contract
    tests/ops/gated_delta_rule/test_onnx.py checks on real exports."""
    from gdn_export.onnx.schemas import register_schemas
    from gdn_export.ops.gated_delta_rule import INPUT_NAMES, OUTPUT_NAMES, PLUGIN_NAME
    from tests.onnx._single_op import ort_session

    register_schemas()
    vi = onnx.helper.make_tensor_value_info
    t, f, s = _ELEM[dtype], onnx.TensorProto.FLOAT, _ELEM[state_dtype]
    Hk, Hv, Dv = heads
    spec = {"q": (t, ["B", "T", Hk, Dk]), "k": (t, ["B", "T", Hk, Dk]), "v": (t, ["B", "T", Hv, Dv]),
            "g": (f, ["B", "T", Hv]), "beta": (t, ["B", "T", Hv]), "initial_state": (s, ["B", Hv, Dk, Dv])}
    inputs = [vi(n, *spec[n]) for n in INPUT_NAMES]
    node = onnx.helper.make_node(PLUGIN_NAME, list(INPUT_NAMES), list(OUTPUT_NAMES), domain="gdn",
                                 plugin_version="1", plugin_namespace="gdn", scale=scale, use_qk_l2norm=int(l2norm))
    outputs = [vi(OUTPUT_NAMES[0], t, None), vi(OUTPUT_NAMES[1], s, None)]
    graph = onnx.helper.make_graph([node], "gdr", inputs, outputs)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18),
                                                        onnx.helper.make_opsetid("gdn", 1)])
    return ort_session(model, form)


def _ort(x, case, form="gdn"):
    from tests.onnx._single_op import run

    dtype = x["v"].dtype
    scale = case.Dk ** -0.5 if case.scale is None else case.scale
    feeds = {n: x[n] for n in _ARGS}
    # the exported node always has a state input (zeros when the model passes none)
    feeds["initial_state"] = x["initial_state"] if x["initial_state"] is not None else \
        torch.zeros(case.N, case.Hv, case.Dk, case.Dv, dtype=case.state_dtype)
    heads = (case.Hk, case.Hv, case.Dv) if form == "ort" else ("Hk", "Hv", "Dv")
    o, s = run(_ort_session(dtype, case.state_dtype, case.Dk, float(scale), case.l2norm, form, heads), feeds)
    return torch.from_numpy(np.asarray(o)), torch.from_numpy(np.asarray(s))


# ------------------------------------------------------------------------- plugin host reference


def _host(x, case):
    scale = case.Dk ** -0.5 if case.scale is None else case.scale
    s0 = x["initial_state"] if x["initial_state"] is not None else torch.zeros(case.N, case.Hv, case.Dk, case.Dv)
    o, s = host_reference.gated_delta_rule(*_args(x), s0, scale, case.l2norm)
    return torch.from_numpy(o).float(), torch.from_numpy(s).float()


# -------------------------------------------------------------------------------- support tables


def _small(case, dtype):
    return "small" in case.tags


def _gpu_case(case, dtype, triton=False):
    """Small cases, and GPU ones (for Triton: on a GPU, at the head sizes its kernels take)."""
    if "small" in case.tags:
        return True
    return "gpu" in case.tags and (not triton or (HAS_CUDA and "triton-ok" in case.tags))


def _with(*conds):
    return lambda case, dtype: all(c(case, dtype) for c in conds)


_NO_VARLEN = lambda case, dtype: not case.varlen  # noqa: E731
_HAS_STATE = lambda case, dtype: case.state  # noqa: E731
_FP32_STATE = lambda case, dtype: case.state_dtype == torch.float32  # noqa: E731
_PATHS = lambda case, dtype: "paths" in case.tags  # noqa: E731
# The CUDA chunked path: head dims multiples of 8, at most 128.
_CHUNKABLE = lambda case, dtype: case.Dk % 8 == 0 and case.Dv % 8 == 0 and case.Dk <= 128 and case.Dv <= 128  # noqa: E731
_TRITON = lambda case, dtype: _gpu_case(case, dtype, triton=True)  # noqa: E731
_GPU = lambda case, dtype: _gpu_case(case, dtype)  # noqa: E731
_ORT_TYPES = lambda case, dtype: dtype != torch.bfloat16 and case.state_dtype != torch.bfloat16  # noqa: E731
_FP32 = lambda case, dtype: dtype == torch.float32  # noqa: E731
# In-place entries are the decode / short-prompt entries: up to 16 tokens.
_SHORT = lambda case, dtype: case.T <= 16  # noqa: E731
# The recurrent Triton kernel walks token by token: up to 300 tokens (the chunked one above).
_NOT_LONG = lambda case, dtype: case.T <= 300  # noqa: E731
# Interpreted on a CPU the recurrent kernel costs ~6 ms a token and program: up to 65 tokens there.
_INTERPRETABLE = lambda case, dtype: HAS_CUDA or case.T <= 65  # noqa: E731
# Through the public op (dispatch, checks, fast entries): one case of each kind.
_OP = lambda case, dtype: "op" in case.tags  # noqa: E731

# The float64 loops of the references are minutes at the GPU cases' sizes: they run the small ones.
IMPLS = [
    Impl("reference-recurrent", "reference", _naive("recurrent"), _small),
    Impl("reference-chunked", "reference", _naive("chunked"), _small),
    Impl("op-reference", "reference", _op("reference"), _small),
    Impl("op-reference-inplace", "reference", _op("reference", inplace=True),
         _with(_small, _NO_VARLEN, _HAS_STATE, _SHORT), extra={"inplace": True}),
    Impl("triton-chunk", "triton", _triton("chunk", form="two-pass"), _TRITON),
    Impl("triton-chunk-fused", "triton", _triton("chunk", form="fused"), _TRITON),
    Impl("triton-recurrent", "triton", _triton("recurrent"), _with(_TRITON, _NOT_LONG, _INTERPRETABLE)),
    Impl("triton-recurrent-inplace", "triton", _triton("recurrent", inplace=True),
         _with(_TRITON, _HAS_STATE, _SHORT), extra={"inplace": True}),
    Impl("op-triton", "triton", _op("triton"), _with(_TRITON, _OP)),
    Impl("cuda-auto", "cuda", _cuda("auto"), _GPU),
    Impl("cuda-recurrent", "cuda", _cuda("recurrent"), _with(_GPU, _PATHS)),
    Impl("cuda-chunked", "cuda", _cuda("chunked"), _with(_GPU, _PATHS, _CHUNKABLE)),
    Impl("cuda-inplace", "cuda", _cuda_inplace, _with(_GPU, _HAS_STATE, _SHORT), extra={"inplace": True}),
    Impl("op-cuda", "cuda", _op("cuda"), _with(_GPU, _OP)),
    Impl("op-cuda-inplace", "cuda", _op("cuda", inplace=True), _with(_GPU, _NO_VARLEN, _HAS_STATE, _SHORT, _OP),
         extra={"inplace": True}),
    Impl("onnxruntime", "onnx", _ort, _with(_small, _NO_VARLEN, _ORT_TYPES)),
    Impl("onnxruntime-ort-form", "onnx", functools.partial(_ort, form="ort"), _with(_small, _NO_VARLEN, _ORT_TYPES)),
    Impl("host-reference", "host", _host, _with(_small, _NO_VARLEN, _FP32_STATE, _FP32),
         requires=host_reference.missing),
]
