"""The stamped export (gdn_export.onnx.stamp: one layer of each kind traced, its subgraph stamped for
every layer of the kind; traced once, gdn_export.onnx.one_trace) against torch.onnx's trace of the
whole model (run_decompositions included): the same graph node for node (ops, attributes, wiring,
value types, initializer bytes) and bit-identical ONNX Runtime outputs, for every family, both K/V
cache layouts, sinks and a window, mixed layer orders and quantized models; the layer kinds
(gdn_export.onnx.kinds) and the trace cache (gdn_export.onnx.trace_cache)."""

from __future__ import annotations

import contextlib
import logging
import os

import numpy as np
import onnx
import onnx_ir
import pytest
import torch

from gdn_export.layout import DeployLayout
from gdn_export.onnx import export as export_module
from gdn_export.onnx import kinds as kinds_module
from gdn_export.onnx import one_trace, stamp, trace_cache
from gdn_export.onnx.export import default_opset, export_onnx
from gdn_export.weights import load_checkpoint, make_tiny_checkpoint
from tests.onnx._same import canonical_difference
from tests.onnx._tiny import CONCAT, TEST_LAYOUT, tiny_checkpoint

L, F = "linear_attention", "full_attention"
# tests/onnx/_tiny.py's layouts: a model of the tiny checkpoints' sizes stamps from the template
# their exports left in the session's trace cache (tests/conftest.py), or leaves one for them
LAYOUTS = {"inplace": TEST_LAYOUT, "concat": CONCAT,
           # boolean masks combined with & and |, a 16-bit recurrent state
           "window": DeployLayout.make(sinks=4, window=60, state_dtype=torch.bfloat16)}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A trace cache of this test's own."""
    folder = tmp_path / "trace-cache"
    monkeypatch.setenv(trace_cache.ENV, str(folder))
    return folder


def _model(root, family, layers, dtype=torch.float32, layout=TEST_LAYOUT, seed=0, **config):
    path = make_tiny_checkpoint(root / f"{family}-{len(layers)}-{seed}", family=family, seed=seed,
                                num_hidden_layers=len(layers), layer_types=list(layers), **config)
    model = load_checkpoint(path, dtype=dtype)
    model.layout = layout
    return model.eval()


@contextlib.contextmanager
def decomposition_reasons():
    """The reasons an export in the block gave for decomposing a program after all
    (gdn_export.onnx.one_trace), as a list filled while it runs."""
    reasons = []

    class Handler(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("decomposed: "):
                reasons.append(record.getMessage())

    logger, handler = logging.getLogger(export_module.__name__), Handler()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield reasons
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _graphs(model, language_graph=None):
    """(stamped, whole-trace) onnx_ir models of `model`'s graph, and the stamped path's progress lines.
    The stamped graph is traced once (gdn_export.onnx.one_trace: asserted to serve it), the whole
    one through torch.onnx's own path, run_decompositions included: equal graphs check the stamping
    and the skipped second trace at once."""
    said = []
    specs, opset = model.state_specs(), default_opset(model.layout)
    with decomposition_reasons() as reasons:
        stamped = (export_module._trace(model, specs, opset, say=said.append) if language_graph is None
                   else language_graph(model, opset, say=said.append))
    assert reasons == [], reasons
    enabled, one_trace.ENABLED = one_trace.ENABLED, False
    try:
        whole = (export_module._trace(model, specs, opset, whole=True) if language_graph is None
                 else language_graph(model, opset, whole=True))
    finally:
        one_trace.ENABLED = enabled
    return stamped, whole, said


def _ort_outputs(model_ir, feeds):
    import onnxruntime as ort

    from gdn_export.onnx.ort_native import prepare

    from gdn_export.onnx.bf16 import emulate_bf16, has_bf16
    from gdn_export.onnx.kv_fp8_ort import emulate_fp8_cache, has_fp8_cache

    proto = onnx_ir.serde.serialize_model(model_ir)
    if has_bf16(proto):  # ORT's CPU provider runs bf16 graphs as fp32 with the same roundings
        proto = emulate_bf16(proto)
    if has_fp8_cache(proto):  # and FP8 caches as fp32 arrays of e4m3 values
        proto = emulate_fp8_cache(proto)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(prepare(proto).model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _feeds(model, seed=1):
    """Random inputs of the graph: ragged rows (the in-place cache), random states."""
    gen = torch.Generator().manual_seed(seed)
    specs = model.state_specs()
    ids = torch.randint(0, model.config.vocab_size, (2, 5), generator=gen)
    if model.layout.inplace:
        past, lens = torch.tensor([3, 0]), torch.tensor([5, 2])
    else:
        past, lens = torch.tensor([4, 4]), torch.tensor([5, 5])
    feeds = {"input_ids": ids.numpy(), "past_lengths": past.numpy(), "seq_lens": lens.numpy()}
    for s in specs:
        t = torch.randn(s.concrete_shape(2, 4), generator=gen).to(s.dtype)
        # bf16 and FP8 states enter the emulations (_ort_outputs) as fp32 arrays of their values
        feeds[s.name] = (t.float() if t.dtype in (torch.bfloat16, torch.float8_e4m3fn) else t).numpy()
    return feeds


def assert_stamped_is_whole(model, kinds_expected=None):
    stamped, whole, said = _graphs(model)
    assert any(line.startswith("stamping ") for line in said), said
    assert not any("does not serve" in line for line in said), said
    if kinds_expected is not None:
        assert any(f"{kinds_expected} layer kinds" in line for line in said), said
    message = canonical_difference(stamped, whole)
    assert message is None, message
    feeds = _feeds(model)
    for name, got, want in zip([v.name for v in whole.graph.outputs], _ort_outputs(stamped, feeds),
                               _ort_outputs(whole, feeds)):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), f"{name} differs"
    return said


# ------------------------------------------------------------------------- stamped == whole trace
# (family, K/V layout): (layers, dtype, extra config); each case stamps at least one layer from its
# kind's representative, a GDN or an attention layer
CASES = {
    ("qwen3_5", "inplace"): ([L, L, F, L, F], torch.float32, {}),  # mixed order, traced now (own cache)
    ("qwen3_5", "concat"): ([L, F, F], torch.float32, {}),
    ("qwen3_next", "inplace"): ([L, F, L, L], torch.float32, {"mlp_only_layers": [3]}),  # sparse-MoE and dense GDN layers
    ("qwen3_next", "concat"): ([L, F, F], torch.float32, {}),
    ("qwen3_5_moe", "inplace"): ([L, F, F], torch.float32, {}),
    ("qwen3_5_moe", "concat"): ([L, F, L], torch.bfloat16, {}),  # folded bf16 weights (fp32 norm scales)
    ("olmo_hybrid", "inplace"): ([L, F, F], torch.float32, {}),  # post-norm attention blocks
    ("olmo_hybrid", "concat"): ([L, F, L], torch.float32, {"tie_word_embeddings": True}),  # lm_head = embedding
    ("qwen3_5", "window"): ([L, F, F], torch.bfloat16, {}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES), ids=lambda c: f"{c[0]}-{c[1]}")
def test_stamped_graph_is_the_whole_trace(tmp_path, monkeypatch, case):
    family, kv = case
    layers, dtype, config = CASES[case]
    if case == ("qwen3_5", "inplace"):  # the template built from this trace, not the session cache's
        monkeypatch.setenv(trace_cache.ENV, str(tmp_path / "trace-cache"))
    model = _model(tmp_path, family, layers, dtype, layout=LAYOUTS[kv], **config)
    said = assert_stamped_is_whole(model)
    if case == ("qwen3_5", "inplace"):
        assert any("tracing 2 layer kinds of 5 layers (layers 0, 2)" in line for line in said), said


def _quantized(root, fmt, layers, kv_cache=None):
    from gdn_export.quantize.pipeline import quantize_model

    path = make_tiny_checkpoint(root / f"q-{fmt}", family="qwen3_5", seed=4, num_hidden_layers=len(layers),
                                layer_types=list(layers))
    rows = [np.random.default_rng(0).integers(0, 256, 48) for _ in range(3)]
    model, _ = quantize_model(load_checkpoint(path, dtype=torch.float16), path, fmt, rows=rows, kv_cache=kv_cache)
    model.layout = TEST_LAYOUT
    return model.eval()


@pytest.mark.slow
def test_stamped_fp8_with_fp8_kv_cache_is_the_whole_trace(tmp_path, cache):
    """FP8 weights and activations; FP8 K/V caches whose per-layer scales the graph holds as
    constants: each attention layer is a kind of its own, the GDN layers share one."""
    model = _quantized(tmp_path, "fp8", [L, F, L, F], kv_cache="fp8")
    kinds = kinds_module.layer_kinds(model)
    assert kinds.kind_of == (0, 1, 0, 2)
    assert_stamped_is_whole(model, kinds_expected=3)
    # A scalar the optimizer's no-op rules would take for 1 where the representative's is not: the
    # layer is a kind of its own, and a template made for the other kind refuses it.
    template = trace_cache.load(trace_cache.cache_key(model, kinds, 24))
    with torch.no_grad():
        model.model.layers[2].mlp.up_proj.input_scale.fill_(1.0)
    assert kinds_module.layer_kinds(model).kind_of == (0, 1, 2, 3)
    with pytest.raises(stamp.StampError, match="is a scalar one where the traced layer's is other"):
        template.instantiate(model, [0, 1, 0, 2])


@pytest.mark.slow
def test_stamped_int4_awq_is_the_whole_trace(tmp_path, cache):
    """INT4 weights folded into INT4 initializers after the stamping (fold_int4_weights)."""
    model = _quantized(tmp_path, "int4-awq", [L, F, L])
    stamped, whole, _ = _graphs(model)
    assert any(v.dtype == onnx_ir.DataType.INT4 for v in stamped.graph.initializers.values())
    assert canonical_difference(stamped, whole) is None


@pytest.mark.slow
def test_stamped_vision_language_graph_is_the_whole_trace(tmp_path):
    """The language graph of a vision-language model (visual embeddings scattered into the
    embeddings, 3-D rotary positions) stamps as the text graph does."""
    from gdn_export.models.vlm import HybridVLForCausalLM
    from gdn_export.vlm.export import language_graph

    path = make_tiny_checkpoint(tmp_path / "vl", family="qwen3_5", seed=0, num_hidden_layers=3, layer_types=[L, F, L])
    lm = load_checkpoint(path, model_class=HybridVLForCausalLM)
    lm.layout = TEST_LAYOUT
    stamped, whole, said = _graphs(lm.eval(), language_graph)
    assert any("tracing 2 layer kinds of 3 layers" in line or "from the trace cache" in line for line in said), said
    assert canonical_difference(stamped, whole) is None


# ------------------------------------------------------------------------- layer kinds
def test_layer_kinds_group_by_structure_and_ignore_the_index(tmp_path):
    model = _model(tmp_path, "qwen3_5", [L, L, F, L, F])
    kinds = kinds_module.layer_kinds(model)
    assert kinds.kind_of == (0, 0, 1, 0, 1) and kinds.representatives == (0, 2)
    assert kinds.describe() == "2 layer kinds of 5 layers"
    reduced = kinds_module.reduced_model(model, kinds.representatives)
    assert [m is model.model.layers[i] for m, i in zip(reduced.model.layers, (0, 2))] == [True, True]
    assert reduced.config.layer_kinds == [L, F] and model.config.num_hidden_layers == 5
    assert reduced.model.embed_tokens is model.model.embed_tokens
    assert [s.name for s in reduced.state_specs()] == ["past.0.conv", "past.0.recurrent", "past.1.key", "past.1.value"]


def test_a_scalar_weight_of_one_or_zero_is_a_kind_of_its_own(tmp_path):
    """The optimizer drops x * 1 and x + 0 with a scalar constant: a one-element weight's closeness
    to 1 or 0 is in the signature, its other values are not."""
    model = _model(tmp_path, "qwen3_5", [L, L, L, F])
    for i, value in ((1, 1.0), (2, 0.37)):
        model.model.layers[i].linear_attn.register_buffer("scale", torch.tensor(value))
    model.model.layers[0].linear_attn.register_buffer("scale", torch.tensor(0.52))
    assert kinds_module.layer_kinds(model).kind_of == (0, 1, 0, 2)


def test_plain_attributes_that_reach_the_graph_make_kinds(tmp_path):
    """A module attribute the forward may bake into the graph (a float, a tensor that is neither
    parameter nor buffer, a function) is part of the signature by value."""
    import torch.nn.functional as fn

    model = _model(tmp_path, "qwen3_5", [L, L, L, L, L])
    attn = [layer.linear_attn for layer in model.model.layers]
    attn[1].extra = torch.tensor([1.0, 2.0])
    attn[2].extra = torch.tensor([1.0, 3.0])
    attn[3].act = fn.silu
    attn[4].act = fn.gelu
    assert kinds_module.layer_kinds(model).kind_of == (0, 1, 2, 3, 4)
    attn[2].extra, attn[4].act = torch.tensor([1.0, 2.0]), fn.silu
    assert kinds_module.layer_kinds(model).kind_of == (0, 1, 1, 2, 2)


# ------------------------------------------------------------------------- fallback and whole trace
class _Traced(Exception):
    pass


@pytest.fixture
def trace_spy(monkeypatch):
    """run_exporter replaced by one that notes the traced model's layers and stops the export."""
    seen = []

    def spy(model, *_args, optimize=True, **_kwargs):
        seen.append((len(model.model.layers), optimize))
        raise _Traced

    monkeypatch.setattr(export_module, "run_exporter", spy)
    return seen


def test_a_model_stamping_cannot_express_is_traced_whole_with_the_reason(tmp_path, cache, trace_spy):
    model = _model(tmp_path, "qwen3_5", [L, L, F])
    model.model.layers[1].mlp.up_proj.weight = model.model.layers[0].mlp.up_proj.weight
    said = []
    with pytest.raises(_Traced):
        export_onnx(model, tmp_path / "m.onnx", progress=said.append)
    assert trace_spy == [(3, True)]
    assert any("stamping does not serve this model (model.layers.1.mlp.up_proj.weight is shared with "
               "layer 0 tensors): tracing all 3 layers" in line for line in said), said


def test_whole_trace_traces_every_layer(tmp_path, cache, trace_spy):
    model = _model(tmp_path, "qwen3_5", [L, L, F])
    said = []
    with pytest.raises(_Traced):
        export_onnx(model, tmp_path / "m.onnx", progress=said.append, whole_trace=True)
    assert trace_spy == [(3, True)]
    assert any("tracing all 3 layers (whole trace)" in line for line in said), said
    with pytest.raises(_Traced):
        export_onnx(model, tmp_path / "m.onnx", progress=said.append)
    assert trace_spy[1] == (2, False)  # one layer of each kind, before the optimizer
    assert any("tracing 2 layer kinds of 3 layers (layers 0, 2)" in line for line in said), said


# ------------------------------------------------------------------------- the trace cache
def _export_graph(model, tmp_path, name):
    path = export_onnx(model, tmp_path / name)
    return onnx_ir.load(path)


@pytest.mark.slow
def test_cache_hit_traces_nothing_and_gives_the_same_graph(tmp_path, cache, monkeypatch):
    """The entry a traced export leaves gives its graph again, node for node, and stamps an
    architecture-alike model (other weights, more layers) without tracing."""
    first = _model(tmp_path, "qwen3_5", [L, F], seed=1)
    opset = default_opset(first.layout)
    cold = export_module._trace(first, first.state_specs(), opset)
    entries = list(cache.glob("*.onnx"))
    assert len(entries) == 1 and entries[0].stat().st_size < 2_000_000

    def no_trace(*_args, **_kwargs):
        raise AssertionError("traced on a cache hit")

    monkeypatch.setattr(export_module, "run_exporter", no_trace)
    said = []
    warm = export_module._trace(first, first.state_specs(), opset, say=said.append)
    assert any("from the trace cache" in line for line in said), said
    assert canonical_difference(warm, cold) is None
    second = _model(tmp_path, "qwen3_5", [L, F, L, L, F], seed=2)
    graph = export_module._trace(second, second.state_specs(), opset)
    assert [v.name for v in graph.graph.outputs][-2:] == ["present.4.key", "present.4.value"]


def test_cache_off_traces_and_writes_nothing(tmp_path, monkeypatch, trace_spy):
    model, _ = _two_layer(tmp_path)
    monkeypatch.setenv(trace_cache.ENV, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert trace_cache.cache_dir() is None
    key = trace_cache.cache_key(model, kinds_module.layer_kinds(model), 24)
    assert trace_cache.load(key) is None and not trace_cache.store(key, object())
    with pytest.raises(_Traced):
        export_onnx(model, tmp_path / "m.onnx")
    assert trace_spy == [(2, False)] and not (tmp_path / "xdg").exists()


def _two_layer(tmp_path):
    path = tiny_checkpoint("qwen3_5", tmp_path)
    model = load_checkpoint(path)
    model.layout = TEST_LAYOUT
    return model, path


@pytest.mark.slow
def test_a_damaged_entry_is_traced_again_and_replaced(tmp_path, cache, monkeypatch):
    model, _ = _two_layer(tmp_path)
    key = trace_cache.cache_key(model, kinds_module.layer_kinds(model), 24)
    cache.mkdir()
    entry = cache / f"{key}.onnx"
    entry.write_bytes(b"\x08\x07not an onnx model")
    assert trace_cache.load(key) is None
    traced = []
    real = export_module.run_exporter

    def counting(*args, **kwargs):
        traced.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(export_module, "run_exporter", counting)
    export_onnx(model, tmp_path / "m.onnx")
    assert traced == [1]
    assert isinstance(trace_cache.load(key), stamp.Template)


def test_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(trace_cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert trace_cache.cache_dir() == tmp_path / "gdn-export"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert trace_cache.cache_dir() == tmp_path / "home" / ".cache" / "gdn-export"
    for off in ("off", "0", ""):
        monkeypatch.setenv(trace_cache.ENV, off)
        assert trace_cache.cache_dir() is None
    monkeypatch.setenv(trace_cache.ENV, str(tmp_path / "elsewhere"))
    assert trace_cache.cache_dir() == tmp_path / "elsewhere"


def test_the_cache_keeps_the_most_recently_used_entries(tmp_path, monkeypatch):
    monkeypatch.setenv(trace_cache.ENV, str(tmp_path))
    monkeypatch.setattr(trace_cache, "MAX_ENTRIES", 2)

    class Stub:
        def to_proto(self):
            return onnx.ModelProto()

    for i, key in enumerate("abc"):
        assert trace_cache.store(key, Stub())
        os.utime(tmp_path / f"{key}.onnx", (1000 + i, 1000 + i))
    trace_cache.store("d", Stub())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.onnx", "d.onnx"]


def test_keys_differ_where_the_graph_differs(tmp_path):
    model, _ = _two_layer(tmp_path)
    kinds = kinds_module.layer_kinds(model)
    key = trace_cache.cache_key(model, kinds, 24)
    assert trace_cache.cache_key(model, kinds, 24) == key
    assert trace_cache.cache_key(model, kinds, 21) != key
    model.layout = CONCAT
    assert trace_cache.cache_key(model, kinds, 24) != key
    model.layout = TEST_LAYOUT
    half = model.half()
    assert trace_cache.cache_key(half, kinds_module.layer_kinds(half), 24) != key
