"""Two-file export of a vision-language checkpoint: the language graph with visual inputs and the
vision encoder (docs/vision.md).

    export_vlm(checkpoint, "model.onnx", ...) -> (model.onnx, model.vision.onnx)

Language graph inputs: input_ids [batch, seq], past_lengths [batch], seq_lens [batch],
rope_positions [3, batch, seq] int64, visual_embeds [num_visual, hidden] (model dtype),
visual_index [num_visual] int64, past.* (gdn_export.models.vlm.HybridVLForCausalLM); outputs as the
text graph. Vision graph: pixel_values [num_patches, C*Tp*P*P] (model dtype), grid_thw
[num_grids, 3] int64 -> visual_embeds [num_merged, hidden] (gdn_export.models.vision).

Both are traced by the torch dynamo exporter at opset 24 (every example size > 1, so that no
dynamic axis is specialised; the language graph from one layer of each kind, stamped for every
layer as the text graph is: gdn_export.onnx.stamp), checked as the text graph is (onnx.checker full_check, strict shape
inference, plugin mapping), written under temporary names in the target folder and renamed into
place only when both passed: a failure leaves neither file behind. Metadata keys
`gdn_export.vlm.*` tie the two files (`VLM_KEYS`); the language file also carries the text graph's
keys (gdn_export.onnx.metadata).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from gdn_export import __version__
from gdn_export.errors import GdnExportError
from gdn_export.onnx import metadata
from gdn_export.paths import publish_files

VISION_SUFFIX = ".vision.onnx"
ROPE_POSITIONS, VISUAL_EMBEDS, VISUAL_INDEX = "rope_positions", "visual_embeds", "visual_index"
VISUAL_INPUTS = (ROPE_POSITIONS, VISUAL_EMBEDS, VISUAL_INDEX)
PIXEL_VALUES, GRID_THW = "pixel_values", "grid_thw"
VLM_PREFIX = metadata.VLM_PREFIX
KEY_FINGERPRINT = VLM_PREFIX + "fingerprint"
KEY_ROLE = metadata.KEY_VLM_ROLE  # "language" | "vision"
KEY_HIDDEN = VLM_PREFIX + "hidden_size"
KEY_CONFIG = VLM_PREFIX + "vision_config"  # JSON of gdn_export.vision_config.VisionConfig
KEY_MROPE = VLM_PREFIX + "mrope_section"
KEY_PREPROCESSOR = VLM_PREFIX + "preprocessor"  # the checkpoint's preprocessor_config.json, if any
NUM_VISUAL, NUM_PATCHES, NUM_GRIDS = "num_visual", "num_patches", "num_grids"
EXAMPLE_GRIDS = [[1, 2, 4], [2, 2, 2]]  # 16 patches, 2 grids, 3 frames


def vision_path(language_path: str | os.PathLike) -> Path:
    """The vision file beside a language file: model.onnx -> model.vision.onnx."""
    path = Path(language_path)
    return path.with_name(path.name.removesuffix(".onnx") + VISION_SUFFIX)


def vlm_metadata(role: str, fingerprint: str, vision_config, hidden: int, mrope=None) -> dict[str, str]:
    out = {KEY_ROLE: role, KEY_FINGERPRINT: fingerprint, KEY_HIDDEN: str(hidden),
           KEY_CONFIG: json.dumps(vision_config.to_dict())}
    if mrope is not None:
        out[KEY_MROPE] = json.dumps(list(mrope))
    return out


def _export(model, args, dynamic_shapes, input_names, output_names, opset: int):
    """gdn_export.onnx.export.run_exporter, stamped with our producer."""
    from gdn_export.onnx.export import run_exporter

    ir_model = run_exporter(model, args, dynamic_shapes, input_names, output_names, opset)
    ir_model.producer_name, ir_model.producer_version = "gdn-export", __version__
    return ir_model


def trace_language(lm, opset: int, optimize: bool = True):
    """The language graph of HybridVLForCausalLM `lm` (module docstring) as an onnx_ir.Model, traced
    whole (optimize False: before the exporter's optimizer)."""
    import torch
    from torch.export import Dim

    from gdn_export.onnx.export import (BATCH, EXAMPLE_BATCH, EXAMPLE_SEQ, LOGITS, PAST, SEQ,
                                        TOKEN_INPUTS, _example_inputs)

    specs = lm.state_specs()
    ids, past, lens, *states = _example_inputs(lm, specs)
    B, T = EXAMPLE_BATCH, EXAMPLE_SEQ
    gen = torch.Generator().manual_seed(1)
    positions = torch.randint(0, 8, (3, B, T), generator=gen).to(lm.device)
    embeds = torch.randn(2, lm.config.hidden_size, generator=gen).to(device=lm.device, dtype=lm.dtype)
    index = torch.tensor([1, T + 1], device=lm.device)
    batch, seq, past_dim = Dim(BATCH, min=1), Dim(SEQ, min=1), Dim(PAST, min=0)
    visual = Dim(NUM_VISUAL, min=0)
    dims = {BATCH: batch, PAST: past_dim}
    state_shapes = tuple({axis: dims[d] for axis, d in enumerate(s.shape) if isinstance(d, str)} for s in specs)
    dynamic = ({0: batch, 1: seq}, {0: batch}, {0: batch}, {1: batch, 2: seq}, {0: visual}, {0: visual},
               state_shapes)
    names_in = [*TOKEN_INPUTS, *VISUAL_INPUTS, *(s.name for s in specs)]
    names_out = [LOGITS, *(s.output_name for s in specs)]
    lm.eval()
    from gdn_export.onnx.export import run_exporter

    return run_exporter(lm, (ids, past, lens, positions, embeds, index, *states), dynamic, names_in, names_out, opset,
                        optimize=optimize)


def language_graph(lm, opset: int, whole: bool = False, say: Callable[[str], None] = lambda _m: None):
    """The optimized language graph of `lm`: stamped from one layer of each kind, or traced whole
    (gdn_export.onnx.export.optimized_graph)."""
    from gdn_export.onnx.export import optimized_graph

    ir_model = optimized_graph(lm, opset, lambda m, optimize: trace_language(m, opset, optimize), whole=whole, say=say)
    ir_model.producer_name, ir_model.producer_version = "gdn-export", __version__
    return ir_model


def trace_vision(vision, opset: int):
    """The vision graph of VisionEncoder `vision` (module docstring) as an onnx_ir.Model."""
    import torch
    from torch.export import Dim

    c = vision.config
    grid = torch.tensor(EXAMPLE_GRIDS, dtype=torch.int64)
    n = int((grid.prod(-1)).sum())
    pixel_values = torch.randn(n, c.patch_dim, generator=torch.Generator().manual_seed(2)).to(vision.dtype)
    dynamic = ({0: Dim(NUM_PATCHES, min=1)}, {0: Dim(NUM_GRIDS, min=1)})
    vision.eval()
    return _export(vision, (pixel_values, grid), dynamic, [PIXEL_VALUES, GRID_THW], [VISUAL_EMBEDS], opset)


def _verify_plain(path: Path, external: bool) -> None:
    """onnx.checker full_check, which includes strict, type-checked shape inference (the vision
    graph has no gdn nodes)."""
    import onnx

    onnx.checker.check_model(str(path) if external else onnx.load(str(path)), full_check=True)


def _save_checked(ir_model, tmp_path: Path, say, plugins: bool = True) -> bool:
    """Save to tmp_path (weights in a sidecar when large) and verify (the plugin mapping check
    only with `plugins`); returns whether the weights went to a sidecar."""
    import onnx_ir

    from gdn_export.onnx.export import EXTERNAL_DATA_THRESHOLD, _initializer_bytes, _verify, external_data_name

    external = _initializer_bytes(ir_model) > EXTERNAL_DATA_THRESHOLD
    onnx_ir.save(ir_model, tmp_path, external_data=external_data_name(tmp_path) if external else None)
    say(f"checking {tmp_path.name} (onnx.checker full_check, strict shape inference"
        + (", plugin mapping)" if plugins else ")"))
    (_verify if plugins else _verify_plain)(tmp_path, external)
    return external


def export_vlm(checkpoint: str | os.PathLike, output: str | os.PathLike, *, dtype=None, layout=None,
               opset: int | None = None, progress: Callable[[str], None] | None = None,
               onnx_ops: str = "gdn", overwrite: bool = True, whole_trace: bool = False) -> tuple[Path, Path]:
    """Export the composite checkpoint's language graph to `output` and its vision encoder to
    `vision_path(output)` (module docstring); returns both paths. dtype: torch dtype of both graphs
    (default: the checkpoint's); layout: the language graph's DeployLayout (default layout);
    onnx_ops: the form of the language graph's GDN layers (gdn_export.onnx.forms); overwrite False:
    files that appeared at the outputs while the export ran are kept and the export ends in an
    OutputError (gdn_export.paths.publish_files); whole_trace: trace every layer of the language
    model instead of stamping one layer of each kind (gdn_export.onnx.export.optimized_graph)."""
    import torch

    from gdn_export.layout import DEFAULT_LAYOUT
    from gdn_export.onnx.export import INPLACE_OPSET, check_export_target, external_data_name, rewrite_form
    from gdn_export.onnx.forms import check_form
    from gdn_export.vlm.weights import fingerprint, load_language, load_vision, vision_config_of

    check_form(onnx_ops)
    layout = layout or DEFAULT_LAYOUT
    opset = INPLACE_OPSET if opset is None else opset
    if not layout.inplace:
        raise GdnExportError("vision-language exports need the inplace kv cache (rows with and without "
                             "images differ in length); drop --kv-cache concat or export --text-only")
    path = check_export_target(output, opset, layout)
    vpath = vision_path(path)
    say = progress or (lambda _msg: None)
    vconfig = vision_config_of(checkpoint)
    say(f"loading {checkpoint}: language model and vision tower ({vconfig.depth} blocks)")
    lm = load_language(checkpoint, dtype=dtype)
    lm.layout = layout
    vision = load_vision(checkpoint, dtype=lm.dtype)
    if vconfig.out_hidden_size != lm.config.hidden_size:
        raise GdnExportError(f"vision_config.out_hidden_size {vconfig.out_hidden_size} differs from the text "
                             f"hidden size {lm.config.hidden_size}")
    print_ = fingerprint(checkpoint)
    dtype_name = metadata.torch_dtype_name(lm.dtype)
    specs = lm.state_specs()
    say(f"language graph: {len(lm.config.layer_kinds)} layers, opset {opset}, {layout.describe()}")
    language = language_graph(lm, opset, whole_trace, say)
    language.metadata_props.update(metadata.make_metadata(
        version=__version__, family=lm.config.family, dtype=dtype_name, opset=opset,
        vocab_size=lm.config.vocab_size, states=metadata.layouts_from_specs(specs), layout=layout))
    from gdn_export.models.vlm import DEFAULT_MROPE_SECTION

    mrope = DEFAULT_MROPE_SECTION if lm.config.mrope_section is None else lm.config.mrope_section
    language.metadata_props.update(vlm_metadata("language", print_, vconfig, lm.config.hidden_size, mrope))
    say(f"tracing the vision graph: {vconfig.depth} blocks, {vconfig.num_heads} heads, opset {opset}")
    with torch.no_grad():
        vis = trace_vision(vision, opset)
    vis.metadata_props.update({metadata.KEY_VERSION: __version__, metadata.KEY_FAMILY: lm.config.family,
                               metadata.KEY_DTYPE: dtype_name, metadata.KEY_OPSET: str(opset)})
    vis.metadata_props.update(vlm_metadata("vision", print_, vconfig, lm.config.hidden_size))
    from gdn_export.vlm.images import read_processor_config

    processor = read_processor_config(checkpoint)
    if processor is not None:
        vis.metadata_props[KEY_PREPROCESSOR] = json.dumps(processor)
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        ext_l = _save_checked(language, tmpdir / path.name, say)
        rewrite_form(tmpdir / path.name, onnx_ops, say)
        ext_v = _save_checked(vis, tmpdir / vpath.name, say, plugins=False)
        moves = []  # each file after its weights, the language graph last
        for target, external in ((vpath, ext_v), (path, ext_l)):
            data = external_data_name(target)
            moves += [(tmpdir / data, target.parent / data)] if external else []
            moves.append((tmpdir / target.name, target))
        publish_files(moves, overwrite=overwrite)
        for target, external in ((vpath, ext_v), (path, ext_l)):
            if not external:  # a sidecar of an earlier export of the same name is stale now
                (target.parent / external_data_name(target)).unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    say(f"wrote {path} and {vpath}")
    return path, vpath
