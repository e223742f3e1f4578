"""Every implementation of the causal conv1d, as contract-suite parameters: `run(x, case)` returns
(y, new_conv_state); outputs go to NaN-poisoned buffers where the entry takes them; in-place entries
(`inplace` in extra) return the conv_state tensor they were given, updated."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import torch

from tests.ops.impl import HAS_CUDA, Impl, poisoned
from tests.plugins import host_reference


def _outputs(x, case):
    dtype, device = x["x"].dtype, x["x"].device
    return poisoned((case.B, case.T, case.C), dtype, device), poisoned((case.B, case.C, case.K - 1), dtype, device)


def _naive(x, case):
    from gdn_export.ops.causal_conv1d.naive import causal_conv1d

    return causal_conv1d(x["x"], x["weight"], x["bias"], x["conv_state"], case.silu, x["seq_lens"])


def _op(backend):
    def run(x, case):
        from gdn_export.ops import causal_conv1d, use_backend

        with use_backend(backend):
            return causal_conv1d(x["x"], x["weight"], x["bias"], x["conv_state"], case.silu, seq_lens=x["seq_lens"])

    return run


def _triton(x, case):
    from kernels.causal_conv1d.triton.conv import causal_conv1d

    y, s = _outputs(x, case)
    y_out, s_out = causal_conv1d(x["x"], x["weight"], x["bias"], x["conv_state"], case.silu, seq_lens=x["seq_lens"],
                                 out=y, new_conv_state=s)
    assert y_out.data_ptr() == y.data_ptr() and (case.K == 1 or s_out.data_ptr() == s.data_ptr())
    return y_out, s_out


def _cuda_out(x, case):
    from gdn_export.ops.causal_conv1d import cuda as backend

    y, s = _outputs(x, case)
    backend.causal_conv1d_out(x["x"], x["weight"], x["bias"], x["conv_state"], case.silu, y, s, seq_lens=x["seq_lens"])
    return y, s


def _cuda_inplace(x, case):
    """The state updated where it lies: the kernel reads the old state it overwrites."""
    from gdn_export.ops.causal_conv1d import cuda as backend

    state = x["conv_state"]
    y = backend.causal_conv1d_inplace(x["x"], x["weight"], x["bias"], state, case.silu, seq_lens=x["seq_lens"])
    return y, state


_ELEM = {torch.float32: onnx.TensorProto.FLOAT, torch.float16: onnx.TensorProto.FLOAT16}


@functools.lru_cache(maxsize=None)
def _ort_session(dtype, C, K, silu, form="gdn"):
    """One gdn.CausalConv1d node (B, T symbolic) through ONNX Runtime's function body, or ("ort")
    rewritten to the ort form's VarlenCausalConvWithState block (gdn_export.onnx.ort_form); the
    exported node's contract is checked by tests/ops/causal_conv1d/test_onnx.py."""
    from gdn_export.onnx.schemas import register_schemas
    from gdn_export.ops.causal_conv1d import (ACTIVATION_NONE, ACTIVATION_SILU, FIELD_ACTIVATION, INPUT_NAMES,
                                              OUTPUT_NAMES, PLUGIN_NAME)
    from tests.onnx._single_op import ort_session

    register_schemas()
    vi = onnx.helper.make_tensor_value_info
    t = _ELEM[dtype]
    spec = {"x": (t, ["B", "T", C]), "weight": (t, [C, K]), "bias": (t, [C]), "conv_state": (t, ["B", C, K - 1]),
            "seq_lens": (onnx.TensorProto.INT32, ["B"])}
    inputs = [vi(n, *spec[n]) for n in INPUT_NAMES]
    node = onnx.helper.make_node(PLUGIN_NAME, list(INPUT_NAMES), list(OUTPUT_NAMES), domain="gdn",
                                 plugin_version="1", plugin_namespace="gdn",
                                 **{FIELD_ACTIVATION: ACTIVATION_SILU if silu else ACTIVATION_NONE})
    graph = onnx.helper.make_graph([node], "conv", inputs, [vi(n, t, None) for n in OUTPUT_NAMES])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18),
                                                        onnx.helper.make_opsetid("gdn", 1)])
    return ort_session(model, form)


def _ort(x, case, form="gdn"):
    from tests.onnx._single_op import run

    dtype = x["x"].dtype
    # the exported node always has every input (zeros / full lengths where the model has none)
    feeds = {"x": x["x"], "weight": x["weight"],
             "bias": x["bias"] if x["bias"] is not None else torch.zeros(case.C, dtype=dtype),
             "conv_state": x["conv_state"] if x["conv_state"] is not None else
             torch.zeros(case.B, case.C, case.K - 1, dtype=dtype),
             "seq_lens": x["seq_lens"] if x["seq_lens"] is not None else torch.full((case.B,), case.T, dtype=torch.int32)}
    y, s = run(_ort_session(dtype, case.C, case.K, case.silu, form), feeds)
    return torch.from_numpy(np.asarray(y)), torch.from_numpy(np.asarray(s))


def _host(x, case):
    b = x["bias"] if x["bias"] is not None else torch.zeros(case.C)
    s0 = x["conv_state"] if x["conv_state"] is not None else torch.zeros(case.B, case.C, case.K - 1)
    y, s = host_reference.causal_conv1d(x["x"], x["weight"], b, s0, case.silu, x["seq_lens"])
    return torch.from_numpy(y).float(), torch.from_numpy(s).float()


def _small(case, dtype):
    return "small" in case.tags


def _any(case, dtype):
    return True


def _triton_cases(case, dtype):
    """Small cases; on a GPU the GPU ones too."""
    return "small" in case.tags or HAS_CUDA


_K2 = lambda case, dtype: case.K >= 2  # noqa: E731  (K = 1 has no state to update in place)
_STATE = lambda case, dtype: case.state  # noqa: E731
_ORT = lambda case, dtype: "small" in case.tags and dtype != torch.bfloat16 and case.K >= 2  # noqa: E731
_HOST = lambda case, dtype: "small" in case.tags and dtype == torch.float32 and case.K >= 2  # noqa: E731
_OP = lambda case, dtype: case.name.startswith(("decode-T1", "T65", "ragged-T63", "T1000-B3"))  # noqa: E731

IMPLS = [
    Impl("reference", "reference", _naive, _small),
    Impl("op-reference", "reference", _op("reference"), _small),
    Impl("triton", "triton", _triton, _triton_cases),
    Impl("op-triton", "triton", _op("triton"), _OP),
    Impl("cuda", "cuda", _cuda_out, _any),
    Impl("cuda-inplace", "cuda", _cuda_inplace, lambda c, d: _K2(c, d) and _STATE(c, d), extra={"inplace": True}),
    Impl("op-cuda", "cuda", _op("cuda"), _OP),
    Impl("onnxruntime", "onnx", _ort, _ORT),
    Impl("onnxruntime-ort-form", "onnx", functools.partial(_ort, form="ort"), _ORT),
    Impl("host-reference", "host", _host, _HOST, requires=host_reference.missing),
]
