"""Every implementation of gdn::attention and of the K/V cache write, as contract-suite parameters.

Attention: `run(x, case)` takes make_inputs' dict on the implementation's device and returns o
[B, H, S, D]. Entries that take an output buffer get a NaN-poisoned one. `skips_unread` in extra:
the entry promises never to read a cache slot no query of its row may read (its inputs hold NaN
keys and inf values there). The public op on a GPU and the SDPA route are held to the plain
contract: SDPA adds the masked-out scores, so NaN there would reach it.

K/V write: `run(x, case)` takes make_write_inputs' dict and returns {name: tensor} of the caches
after the write: in-place entries (`inplace` in extra) the very tensors (and buffers) they were
given, functional ones new caches (their inputs checked unchanged).

There is no plugin host reference: TensorRT runs both ops with its own layers (IAttention,
KV_CACHE_UPDATE); tests/trt/test_build_kv.py builds them.
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import onnx
import torch

from tests.ops.impl import HAS_CUDA, Impl, poisoned

_ATTN = ("q", "key", "value", "mask")


def _attn_args(x):
    return [x[n] for n in _ATTN] + [x["scale"]]


# ------------------------------------------------------------------------------------ attention


def _op(x, case):
    from gdn_export.ops.attention import attention

    return attention(*_attn_args(x))


def _op_cuda(x, case):
    """The public op on CUDA tensors (fp16 / bf16: the Triton kernels by shape, else SDPA; fp32:
    SDPA in fp32), and the same result from its undispatched body."""
    from gdn_export.ops.attention import _attention, attention

    o = attention(*_attn_args(x))
    assert torch.equal(_attention(*_attn_args(x)), o), "the op and its body disagree"
    return o


@contextlib.contextmanager
def _repeated_mask_max(value):
    import gdn_export.ops.attention as module

    old = module.REPEATED_MASK_MAX
    module.REPEATED_MASK_MAX = value
    try:
        yield
    finally:
        module.REPEATED_MASK_MAX = old


def _sdpa(route):
    """The SDPA route of the op's half-precision GPU path: the mask repeated over a kv head's G query
    heads for one call (small calls), or one call per query head against a shared additive mask
    (REPEATED_MASK_MAX = 0 forces it)."""

    def run(x, case):
        from gdn_export.ops.attention import REPEATED_MASK_MAX, _attention_sdpa

        with _repeated_mask_max(0 if route == "per-head" else REPEATED_MASK_MAX):
            return _attention_sdpa(*_attn_args(x))

    return run


def _triton_decode(x, case):
    """The split-KV decode kernel into a NaN-poisoned output; strided cases: an output view with gaps
    between rows ([B, S, H, 2 D][..., :D] as [B, H, S, D]), whose gaps must stay NaN."""
    from kernels.attention.triton.decode import attention_decode

    q = x["q"]
    B, H, S, D = q.shape
    if case.strided:
        buf = poisoned((B, S, H, 2 * D), q.dtype, q.device)
        out = buf[..., :D].transpose(1, 2)
    else:
        buf, out = None, poisoned(tuple(q.shape), q.dtype, q.device)
    n_splits, block_n = case.splits or (None, None)
    o = attention_decode(*_attn_args(x), out=out, n_splits=n_splits, block_n=block_n)
    assert o is out, "attention_decode did not return its out"
    if buf is not None:
        assert torch.isnan(buf[..., D:]).all(), "attention_decode wrote outside its output view"
    return o


def _triton_prefill(x, case):
    from kernels.attention.triton.prefill import attention_prefill

    o = attention_prefill(*_attn_args(x), block=case.block)
    assert o.stride() == torch.empty_like(x["q"]).stride(), "o does not have empty_like(q)'s strides"
    return o


_ELEM = {torch.float32: onnx.TensorProto.FLOAT, torch.float16: onnx.TensorProto.FLOAT16}


def _quiet_session(model):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # TensorScatter warns on every run that it copies the cache
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@functools.lru_cache(maxsize=None)
def _ort_attention(dtype, scale):
    """One ONNX Attention node (opset 23 form, 4-D inputs: GQA from the head counts), as
    gdn_export.ops.attention.onnx emits for gdn::attention (every dim symbolic: one session per
    dtype and scale)."""
    from gdn_export.ops.attention.onnx import OPSET

    vi = onnx.helper.make_tensor_value_info
    t = _ELEM[dtype]
    inputs = [vi("q", t, ["B", "H", "S", "D"]), vi("key", t, ["B", "Hkv", "L", "D"]),
              vi("value", t, ["B", "Hkv", "L", "D"]), vi("mask", onnx.TensorProto.BOOL, ["Bm", 1, "Sm", "L"])]
    node = onnx.helper.make_node("Attention", list(_ATTN), ["o"], scale=scale)
    graph = onnx.helper.make_graph([node], "attention", inputs, [vi("o", t, None)])
    return _quiet_session(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)]))


def _ort(x, case):
    """ONNX Runtime's CPU Attention; it takes a mask broadcast over batch rows but not over queries
    (it asks mask dim -2 == S: onnxruntime 1.32), so a [., 1, 1, L] mask is expanded along S here.
    The exporter's masks are always [B, 1, S, L] (gdn_export.modules.kv_cache)."""
    session = _ort_attention(x["q"].dtype, float(x["scale"]))
    feeds = dict(x, mask=x["mask"].expand(x["mask"].shape[0], 1, case.S, case.L))
    (o,) = session.run(None, {n: feeds[n].contiguous().numpy() for n in _ATTN})
    return torch.from_numpy(np.asarray(o))


def _half(case, dtype):
    return dtype in (torch.float16, torch.bfloat16)


def _small(case, dtype):
    return "small" in case.tags


def _small_or_gpu(case, dtype):
    """Small cases; on a GPU the GPU ones too."""
    return "small" in case.tags or HAS_CUDA


def _decode_takes(case, dtype):
    """The decode kernel's shapes: D a power of two in 16..256, G * S <= max_rows(D) (16-bit)."""
    from kernels.attention.triton.decode import max_rows

    D = case.D
    return _half(case, dtype) and 16 <= D <= 256 and not D & (D - 1) and case.G * case.S <= max_rows(D)


def _prefill_takes(case, dtype):
    """The prefill kernel's shapes: D <= 256 (16-bit)."""
    return _half(case, dtype) and case.D <= 256


# Under Triton's interpreter (seconds a case on a CPU) each kernel takes the cases of its own kind:
# the decode kernel a few query rows (S <= 3), the prefill kernel many, or one against a short
# context in a long cache (which the op sends it). On a GPU both take every case they support.
_DECODE_KIND = lambda case, dtype: HAS_CUDA or case.S <= 3  # noqa: E731
_PREFILL_KIND = lambda case, dtype: HAS_CUDA or case.S > 3 or case.mask == "short-in-long"  # noqa: E731


_FP32 = lambda case, dtype: dtype == torch.float32  # noqa: E731
_ORT = lambda case, dtype: _small(case, dtype) and dtype != torch.bfloat16  # noqa: E731
# The SDPA route (the op's half-precision GPU path where neither Triton kernel applies): its cases
# ("sdpa"), fp32 on a CPU; on a GPU in every dtype, with two model-sized ones (a decode step over a
# 4099-slot cache; a prefill above REPEATED_MASK_MAX, where it calls once per query head).
_SDPA_CPU = lambda case, dtype: "sdpa" in case.tags  # noqa: E731
_SDPA_GPU = lambda case, dtype: (  # noqa: E731
    "sdpa" in case.tags or case.name.startswith(("decode-B2-G8", "prefill-B1-G8-S2100")))


def _with(*conds):
    return lambda case, dtype: all(c(case, dtype) for c in conds)


ATTENTION = [
    Impl("op", "reference", _op, _small),
    Impl("sdpa-one-call", "reference", _sdpa("one-call"), _with(_SDPA_CPU, _FP32)),
    Impl("sdpa-per-head-calls", "reference", _sdpa("per-head"), _with(_SDPA_CPU, _FP32)),
    Impl("triton-decode", "triton", _triton_decode, _with(_small_or_gpu, _decode_takes, _DECODE_KIND),
         extra={"skips_unread": True}),
    Impl("triton-prefill", "triton", _triton_prefill, _with(_small_or_gpu, _prefill_takes, _PREFILL_KIND),
         extra={"skips_unread": True}),
    Impl("op-cuda", "cuda", _op_cuda, lambda case, dtype: True),
    Impl("sdpa-one-call-cuda", "cuda", _sdpa("one-call"), _SDPA_GPU),
    Impl("sdpa-per-head-calls-cuda", "cuda", _sdpa("per-head"), _SDPA_GPU),
    Impl("onnxruntime", "onnx", _ort, _ORT),
]


# ------------------------------------------------------------------------------------ K/V write

_WRITE = ("key_cache", "value_cache", "key", "value", "write_indices")


def _write_args(x):
    return [x[n] for n in _WRITE]


def _in_place(x):
    return {n: x[n] for n in ("key_cache", "value_cache", "key_base", "value_base") if n in x}


def _kv_cache_update(x, case):
    """gdn::kv_cache_update (the functional form the ONNX graph computes): new caches, inputs untouched."""
    from gdn_export.ops.attention import kv_cache_update

    before = [x[n].clone() for n in ("key_cache", "value_cache")]
    kc = kv_cache_update(x["key_cache"], x["key"], x["write_indices"])
    vc = kv_cache_update(x["value_cache"], x["value"], x["write_indices"])
    assert torch.equal(x["key_cache"], before[0]) and torch.equal(x["value_cache"], before[1]), \
        "the functional update wrote its input"
    return {"key_cache": kc, "value_cache": vc}


def _write_op(dispatcher, kernel=False):
    """gdn::write_kv_cache_ called directly (eager: no dispatcher) or through torch.ops; kernel: on a
    GPU, and the one-launch Triton kernel must have done the write."""

    def run(x, case):
        from gdn_export.ops.attention import write_kv_cache_
        from kernels.attention.triton import kv_cache_write

        fn = torch.ops.gdn.write_kv_cache_ if dispatcher else write_kv_cache_
        calls = []
        original = kv_cache_write.kv_cache_write_
        kv_cache_write.kv_cache_write_ = lambda *a: calls.append(1) or original(*a)
        try:
            assert fn(*_write_args(x)) is None
        finally:
            kv_cache_write.kv_cache_write_ = original
        if kernel:
            assert calls == [1], "the public op on a GPU did not take the Triton kernel"
        return _in_place(x)

    return run


def _triton_write(x, case):
    from kernels.attention.triton.kv_cache_write import kv_cache_write_, supports

    assert supports(*_write_args(x))
    kv_cache_write_(*_write_args(x))
    return _in_place(x)


@functools.lru_cache(maxsize=None)
def _ort_scatter(dtype):
    """Two ONNX TensorScatter nodes (opset 24, axis 2, mode "linear"), as
    gdn_export.ops.attention.onnx emits for gdn::kv_cache_update of each cache (every dim symbolic)."""
    from gdn_export.ops.attention.onnx import OPSET

    vi = onnx.helper.make_tensor_value_info
    t = _ELEM[dtype]
    inputs = [vi("key_cache", t, ["B", "Hkv", "L", "D"]), vi("value_cache", t, ["B", "Hkv", "L", "D"]),
              vi("key", t, ["B", "Hkv", "S", "D"]), vi("value", t, ["B", "Hkv", "S", "D"]),
              vi("write_indices", onnx.TensorProto.INT64, ["B"])]
    nodes = [onnx.helper.make_node("TensorScatter", [c, u, "write_indices"], [f"new_{c}"], axis=2, mode="linear")
             for c, u in (("key_cache", "key"), ("value_cache", "value"))]
    graph = onnx.helper.make_graph(nodes, "kv_write", inputs, [vi("new_key_cache", t, None),
                                                               vi("new_value_cache", t, None)])
    return _quiet_session(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)]))


def _ort_write(x, case):
    session = _ort_scatter(x["key_cache"].dtype)
    kc, vc = session.run(None, {n: x[n].contiguous().numpy() for n in _WRITE})
    return {"key_cache": torch.from_numpy(np.asarray(kc)), "value_cache": torch.from_numpy(np.asarray(vc))}


def _fits(case, dtypes, index_dtype):
    """Rows inside the cache: the ops' contract (past_end is the Triton kernel's own)."""
    return not case.past_end


def _small_fits(case, dtypes, index_dtype):
    return "small" in case.tags and _fits(case, dtypes, index_dtype)


def _triton_write_cases(case, dtypes, index_dtype):
    return "small" in case.tags or HAS_CUDA


def _ort_write_cases(case, dtypes, index_dtype):
    """TensorScatter: caches and updates of one type (no bfloat16 on ORT's CPU), int64 indices."""
    return (_small_fits(case, dtypes, index_dtype) and not case.cache_view and dtypes[0] == dtypes[1]
            and dtypes[0] != torch.bfloat16 and index_dtype == torch.int64)


WRITE = [
    Impl("kv-cache-update", "reference", _kv_cache_update, _small_fits),
    Impl("op", "reference", _write_op(dispatcher=False), _small_fits, extra={"inplace": True}),
    Impl("op-dispatcher", "reference", _write_op(dispatcher=True), _small_fits, extra={"inplace": True}),
    Impl("triton", "triton", _triton_write, _triton_write_cases, extra={"inplace": True}),
    Impl("op-cuda", "cuda", _write_op(dispatcher=False, kernel=True), _fits, extra={"inplace": True}),
    Impl("op-dispatcher-cuda", "cuda", _write_op(dispatcher=True, kernel=True), _fits, extra={"inplace": True}),
    Impl("onnxruntime", "onnx", _ort_write, _ort_write_cases),
]
