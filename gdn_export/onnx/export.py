"""`export_onnx`: one ONNX graph serving prefill and decode, with gdn custom nodes.

    inputs   input_ids [batch, seq] int64 (rows right-padded), past_lengths [batch] int64,
             seq_lens [batch] int64, past.{i}.conv|recurrent|key|value (model.state_specs(), in order)
    outputs  logits [batch, 1, V] fp32 (or [batch, seq, V]), present.{i}.* (same order)

The model's `layout` (gdn_export.layout) decides the K/V cache form: in place (default; the
graph's opset is 24 for TensorScatter) or concatenated (opset 18..21, as older TensorRT parses).

The torch dynamo exporter traces the model with example sizes B=2, T=3 (and P=5 for the concat
layout): torch.export specialises any dim whose example is 0 or 1, so prefill-only (P = 0) or
decode-only (T = 1) examples would bake those sizes in. It traces one decoder layer of each kind, or
none when the trace cache holds the architecture, and stamps that layer's subgraph for every layer
of its kind (gdn_export.onnx.stamp, docs/export-time.md: the graph of a trace of the whole model,
node for node); `whole_trace` traces every layer. The gdn ops become bare gdn.* nodes through the
translations in gdn_export/ops/*/onnx.py. The result is checked (onnx.checker full_check, which
includes strict shape inference, and the TensorRT plugin mapping) in a temporary folder beside the
target, then renamed into place; a failure leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import onnx

from gdn_export import __version__
from gdn_export.errors import GdnExportError
from gdn_export.onnx import metadata, one_trace, registry_cache
from gdn_export.onnx.checks import MAX_OPSET, check_plugin_mappable
from gdn_export.ops.attention.onnx import OPSET as ATTENTION_OPSET
from gdn_export.onnx.schemas import custom_translation_table, register_schemas
from gdn_export.paths import publish_files

ONNX_OPSET = 18  # the concat layout's default
INPLACE_OPSET = ATTENTION_OPSET  # TensorScatter
# torch's exporter builds opset 18 and cannot convert its reductions (axes as inputs) down to 17;
# TensorRT 10 parses up to 21 (the concat layout), TensorRT 10.15+ / TensorRT-RTX 1.7 up to 24.
MIN_EXPORT_OPSET, MAX_EXPORT_OPSET = 18, MAX_OPSET
INPUT_IDS, PAST_LENGTHS, SEQ_LENS, LOGITS = "input_ids", "past_lengths", "seq_lens", "logits"
TOKEN_INPUTS = (INPUT_IDS, PAST_LENGTHS, SEQ_LENS)
BATCH, SEQ, PAST = "batch", "seq", "past"
# Example sizes for tracing: all > 1 so that no dynamic dim is specialised (see module docstring).
EXAMPLE_BATCH, EXAMPLE_SEQ, EXAMPLE_PAST = 2, 3, 5
# Protobuf cannot serialise 2 GiB; leave room for the graph itself.
EXTERNAL_DATA_THRESHOLD = 2**31 - 2**27


def external_data_name(path: str | os.PathLike) -> str:
    """The sidecar holding the weights of a large model: `<name>.data` beside `<name>`."""
    return Path(path).name + ".data"


def default_opset(layout) -> int:
    """The opset export_onnx writes for `layout` when none is asked for."""
    return INPLACE_OPSET if layout.inplace else ONNX_OPSET


def trace_cache_bytes(config, layout, dtype_bytes: int) -> int:
    """Bytes of the example K/V cache a trace of `config` under `layout` holds: the in-place cache's
    inputs and outputs at EXAMPLE_BATCH rows of cache_len slots in every attention layer (0 for the
    concat cache, whose example holds EXAMPLE_PAST slots)."""
    from gdn_export.config import FULL

    if not layout.inplace:
        return 0
    layers = sum(kind == FULL for kind in config.layer_kinds)
    per_slot = config.num_key_value_heads * config.head_dim * dtype_bytes
    return 2 * 2 * EXAMPLE_BATCH * layers * layout.cache_len * per_slot  # K and V, inputs and outputs


def _example_inputs(model, specs):
    import torch

    device = model.device
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab, (EXAMPLE_BATCH, EXAMPLE_SEQ), generator=gen).to(device)
    if model.layout.inplace:  # ragged rows: any values work, the shapes are what is traced
        past_lengths = torch.tensor([1, 0], device=device)
        seq_lens = torch.tensor([EXAMPLE_SEQ, EXAMPLE_SEQ - 1], device=device)
    else:
        past_lengths = torch.full((EXAMPLE_BATCH,), EXAMPLE_PAST, device=device)
        seq_lens = torch.full((EXAMPLE_BATCH,), EXAMPLE_SEQ, device=device)
    # Small random states: zeros could let the exporter fold a state away.
    states = [0.1 * torch.randn(s.concrete_shape(EXAMPLE_BATCH, EXAMPLE_PAST), generator=gen)
              .to(device=device, dtype=s.dtype) if s.dtype != torch.float8_e4m3fn  # no float8 arithmetic on CPU
              else (0.1 * torch.randn(s.concrete_shape(EXAMPLE_BATCH, EXAMPLE_PAST), generator=gen)).to(device, s.dtype)
              for s in specs]
    return (input_ids, past_lengths, seq_lens, *states)


def _dynamic_shapes(specs):
    from torch.export import Dim

    batch, seq, past = Dim(BATCH, min=1), Dim(SEQ, min=1), Dim(PAST, min=0)
    dims = {BATCH: batch, PAST: past}
    tokens, rows = {0: batch, 1: seq}, {0: batch}
    states = [{axis: dims[d] for axis, d in enumerate(s.shape) if isinstance(d, str)} for s in specs]
    # torch.export sees forward(input_ids, past_lengths, seq_lens, *states) as four arguments, the
    # last being the tuple of states.
    return (tokens, rows, rows, tuple(states))


# Node metadata torch.onnx writes that names the exporting machine's files (absolute paths and
# line numbers of the model's source): dropped, so that one checkpoint exported with one version
# gives the same bytes wherever gdn-export is installed.
MACHINE_METADATA = ("pkg.torch.onnx.stack_trace",)


def run_exporter(model, args, dynamic_shapes, input_names, output_names, opset: int, optimize: bool = True):
    """torch.onnx.export (dynamo, our translations) -> onnx_ir.Model with local functions inlined
    and no machine-specific node metadata; the exporter's chatter swallowed. RuntimeError when the
    graph's I/O names are not `input_names` / `output_names`. optimize False: the exporter's graph
    before its optimizer (gdn_export.onnx.stamp runs the optimizer's passes itself)."""
    import torch

    chatter = io.StringIO()
    # The exporter prints its phases and logs registry warnings (e.g. torchvision missing) that
    # say nothing about this model; our own progress lines replace them.
    registry_log = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registry_log.level
    registry_log.setLevel(logging.ERROR)
    one = (one_trace.skip_redundant_decomposition(log=lambda why: logging.getLogger(__name__).info("decomposed: %s", why))
           if one_trace.enabled() else contextlib.nullcontext())
    try:
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(chatter), one, \
                registry_cache.reuse_torchlib_registry():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                model, args, dynamo=True, dynamic_shapes=dynamic_shapes,
                input_names=list(input_names), output_names=list(output_names), opset_version=opset,
                custom_translation_table=custom_translation_table(), optimize=optimize, verbose=False,
            )
    finally:
        registry_log.setLevel(level)
    ir_model = program.model
    got = ([v.name for v in ir_model.graph.inputs], [v.name for v in ir_model.graph.outputs])
    if got != (list(input_names), list(output_names)):
        raise RuntimeError(f"exported graph I/O {got} differs from {list(input_names)} / {list(output_names)}")
    if len(ir_model.functions):
        # The exporter may wrap pieces in local functions; TensorRT must see plain nodes.
        from onnx_ir.passes.common import InlinePass, RemoveUnusedFunctionsPass

        InlinePass()(ir_model)
        RemoveUnusedFunctionsPass()(ir_model)
    for node in ir_model.graph.all_nodes():
        for key in MACHINE_METADATA:
            node.metadata_props.pop(key, None)
    return ir_model


def _trace(model, specs, opset: int, *, whole: bool = False, say: Callable[[str], None] = lambda _m: None):
    """The optimized graph of the model's forward(input_ids, past_lengths, seq_lens, *states)
    (`optimized_graph`), its INT4 weights folded."""

    def trace(m, optimize: bool):
        s = m.state_specs()
        return run_exporter(m, _example_inputs(m, s), _dynamic_shapes(s), _input_names(s), _output_names(s), opset,
                            optimize=optimize)

    ir_model = optimized_graph(model, opset, trace, whole=whole, say=say)
    if ir_model.opset_imports.get("") != opset:
        raise RuntimeError(f"asked the exporter for opset {opset}, got {ir_model.opset_imports}")
    from gdn_export.ops.moe_quant.onnx import fold_int4_expert_weights
    from gdn_export.ops.quant_linear.onnx import fold_int4_weights

    fold_int4_expert_weights(ir_model)  # quantized routed experts as INT4 [E, N, K] initializers
    fold_int4_weights(ir_model)  # W4A16 weights as INT4 initializers (none in a 16-bit model)
    return ir_model


def _input_names(specs) -> list[str]:
    return [*TOKEN_INPUTS, *(s.name for s in specs)]


def _output_names(specs) -> list[str]:
    return [LOGITS, *(s.output_name for s in specs)]


def optimized_graph(model, opset: int, trace: Callable, *, whole: bool = False,
                    say: Callable[[str], None] = lambda _m: None):
    """The optimized onnx_ir graph of `model` (a HybridForCausalLM or subclass), stamped from a trace of
    one layer of each kind (gdn_export.onnx.stamp; the trace cached by gdn_export.onnx.trace_cache)
    or, with `whole` or where stamping cannot serve the model (said through `say`), traced whole.
    trace(m, optimize) -> onnx_ir.Model: run_exporter on model `m` (the model or a reduced copy of it)
    with its graph I/O, the exporter's optimizer on or off. Either way every dynamic dim is read
    from the first graph input that has it."""
    from gdn_export.onnx import stamp

    layers = len(model.config.layer_kinds)
    if not whole:
        try:
            return _stamped(model, opset, trace, say)
        except stamp.StampError as exc:
            say(f"stamping does not serve this model ({exc}): tracing all {layers} layers")
    else:
        say(f"tracing all {layers} layers (whole trace)")
    ir_model = trace(model, True)
    if stamp.canonical_dim_sources(ir_model):
        stamp.eliminate_common_subexpressions(ir_model)
    return ir_model


def _stamped(model, opset: int, trace: Callable, say: Callable[[str], None]):
    """The model's graph stamped from a template (gdn_export.onnx.stamp): the cached one for this
    architecture, else one traced now from a reduced model. StampError where the model is not one
    the template can express."""
    from gdn_export.onnx import kinds as kinds_module, stamp, trace_cache

    stamp.check_supported(model)
    kinds = kinds_module.layer_kinds(model)
    key = trace_cache.cache_key(model, kinds, opset)
    template = trace_cache.load(key)
    if template is None:
        stamp.check_optimizer()
        reduced = kinds_module.reduced_model(model, kinds.representatives)
        say(f"tracing {kinds.describe()} (layers {', '.join(map(str, kinds.representatives))})")
        raw = trace(reduced, False)
        folds = stamp.FoldLog()
        stamp.optimize_layers(raw, folds)
        stamp.canonical_dim_sources(raw)
        tensors = dict(reduced.named_parameters(remove_duplicate=False))
        tensors.update(reduced.named_buffers(remove_duplicate=False))
        template = stamp.Template.build(raw, folds, tensors)
        cached = False
    else:
        say(f"{kinds.describe()}: graph of each kind from the trace cache ({trace_cache.describe(key)})")
        cached = True
    say(f"stamping {len(kinds.kind_of)} layers")
    ir_model = template.instantiate(model, list(kinds.kind_of))
    if not cached:
        trace_cache.store(key, template)
    stamp.optimize_across_layers(ir_model)
    return ir_model


def _initializer_bytes(ir_model) -> int:
    return sum(v.const_value.nbytes for v in ir_model.graph.initializers.values()
               if v.const_value is not None)


def _verify(onnx_path: Path, external: bool) -> None:
    """onnx.checker full_check (which includes strict, type-checked shape inference) and the
    plugin-mapping check, on the file as written (a sidecar's data is not read)."""
    register_schemas()
    if external:  # the path form also checks the sidecar it names
        onnx.checker.check_model(str(onnx_path), full_check=True)
        proto = onnx.load(str(onnx_path), load_external_data=False)
    else:
        proto = onnx.load(str(onnx_path))
        onnx.checker.check_model(proto, full_check=True)
    check_plugin_mappable(proto)


def rewrite_form(path: Path, onnx_ops: str, say=lambda _msg: None) -> None:
    """Rewrite the checked gdn-form file `path` in place into form `onnx_ops` (nothing for "gdn")."""
    if onnx_ops == "standard":
        from gdn_export.onnx.standard_ops import rewrite_file_to_standard

        rewrite_file_to_standard(path, say)
    elif onnx_ops == "ort":
        from gdn_export.onnx.ort_form import rewrite_file_to_ort

        rewrite_file_to_ort(path, say)


def check_export_target(path: str | os.PathLike, opset: int | None = None, layout=None) -> Path:
    """GdnExportError unless `export_onnx` can write `path` at `opset` (default: the layout's): the
    opset is in [MIN_EXPORT_OPSET, MAX_EXPORT_OPSET] (the in-place layout needs >= 24), the name ends
    in .onnx, its folder exists and it is not a folder itself. Cheap: callers may check before
    loading a checkpoint. Returns Path(path)."""
    from gdn_export.layout import DEFAULT_LAYOUT

    layout = layout or DEFAULT_LAYOUT
    opset = default_opset(layout) if opset is None else opset
    path = Path(path)
    if isinstance(opset, bool) or not isinstance(opset, int) \
            or not MIN_EXPORT_OPSET <= opset <= MAX_EXPORT_OPSET:
        raise GdnExportError(f"opset {opset!r} is outside the range gdn-export writes and TensorRT "
                             f"parses [{MIN_EXPORT_OPSET}, {MAX_EXPORT_OPSET}]")
    if layout.inplace and opset < INPLACE_OPSET:
        raise GdnExportError(f"opset {opset} has no TensorScatter: the inplace kv cache needs opset >= "
                             f"{INPLACE_OPSET} (or export with --kv-cache concat)")
    if path.suffix != ".onnx":
        raise GdnExportError(f"{path}: the output file name must end in .onnx")
    if not path.parent.is_dir():
        raise GdnExportError(f"{path}: folder {path.parent} does not exist")
    if path.is_dir():
        raise GdnExportError(f"{path}: is a folder")
    return path


def export_onnx(model, path: str | os.PathLike, *, opset: int | None = None,
                progress: Callable[[str], None] | None = None, onnx_ops: str = "gdn",
                overwrite: bool = True, whole_trace: bool = False) -> Path:
    """Export `model` (HybridForCausalLM, any dtype, shaped by `model.layout`) to `path`; returns
    the written path. `opset` defaults to 24 for the in-place layout, 18 for the concat layout.

    Weights go to a sidecar `<name>.data` when they exceed ~2 GB. metadata_props record the
    gdn-export version, family, dtype, opset, vocab size, the state layout and the deployment
    layout (`gdn_export.onnx.metadata`). `onnx_ops` (gdn_export.onnx.forms): "gdn" (default) the
    gdn nodes; "standard" the GDN layers as opset-27 LinearAttention / CausalConvWithState blocks
    (gdn_export.onnx.standard_ops; opset 27); "ort" as ONNX Runtime's com.microsoft GatedDeltaNet /
    VarlenCausalConvWithState / GatedRMSNorm (gdn_export.onnx.ort_form).
    overwrite False: a file that appeared at `path` (or its sidecar) while the export ran is kept
    and the export ends in an OutputError (gdn_export.paths.publish_files).
    whole_trace: trace the whole model instead of one layer per kind stamped for every layer of its
    kind (gdn_export.onnx.stamp; the same graph, node for node); the stamped path also falls back to
    it, saying why, for a model it cannot express.
    """
    from gdn_export.onnx.forms import check_form

    check_form(onnx_ops)
    layout = model.layout
    opset = default_opset(layout) if opset is None else opset
    path = check_export_target(path, opset, layout)
    say = progress or (lambda _msg: None)
    from gdn_export.modules.quant_linear import quantized_formats
    from gdn_export.ops.quant_linear.onnx import MIN_OPSET as QUANT_OPSET

    formats = quantized_formats(model)
    if formats and opset < QUANT_OPSET:
        raise GdnExportError(f"opset {opset}: quantized layers ({', '.join(sorted(formats))}) need FLOAT8 / INT4 "
                             f"Q/DQ of opset >= {QUANT_OPSET}")
    model.eval()
    specs = model.state_specs()
    say(f"exporting {len(model.config.layer_kinds)} layers ({len(specs)} state tensors), opset {opset}, "
        f"{layout.describe()}")
    ir_model = _trace(model, specs, opset, whole=whole_trace, say=say)
    ir_model.metadata_props.update(metadata.make_metadata(
        version=__version__, family=model.config.family,
        dtype=metadata.torch_dtype_name(model.dtype), opset=opset,
        vocab_size=model.config.vocab_size, states=metadata.layouts_from_specs(specs),
        layout=layout, quantization=metadata.quantization_name(formats),
    ))
    from gdn_export.modules.kv_cache_fp8 import kv_scales

    ir_model.metadata_props.update(metadata.kv_cache_metadata(kv_scales(model)))  # FP8 K/V cache only
    return write_checked(ir_model, path, say, onnx_ops, overwrite=overwrite)


def write_checked(ir_model, path: Path, say: Callable[[str], None], onnx_ops: str = "gdn", *,
                  overwrite: bool = True) -> Path:
    """Write `ir_model` to `path` through a temporary folder beside it: weights in a `<name>.data`
    sidecar past ~2 GB, the checks of `_verify`, the form `onnx_ops` (`rewrite_form`), then moved into
    place (a failure leaves nothing behind; overwrite False: a file that appeared at `path` meanwhile
    is kept and the write ends in an OutputError, gdn_export.paths.publish_files). Returns path."""
    ir_model.producer_name, ir_model.producer_version = "gdn-export", __version__
    external = _initializer_bytes(ir_model) > EXTERNAL_DATA_THRESHOLD
    data_name = external_data_name(path)
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        import onnx_ir

        tmp_path = tmpdir / path.name
        say(f"writing {path.name}" + (f" with weights in {data_name}" if external else ""))
        onnx_ir.save(ir_model, tmp_path, external_data=data_name if external else None)
        say("checking (onnx.checker full_check, strict shape inference, plugin mapping)")
        _verify(tmp_path, external)
        rewrite_form(tmp_path, onnx_ops, say)
        # the weights first, so that the new .onnx never points at missing data
        moves = [(tmpdir / data_name, path.parent / data_name)] if external else []
        publish_files([*moves, (tmp_path, path)], overwrite=overwrite)
        if not external:
            # A sidecar left by an earlier large export of the same name is stale now.
            (path.parent / data_name).unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    say(f"wrote {path}")
    return path
