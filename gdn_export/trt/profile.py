"""Optimisation profiles: trtexec-style shape specs and defaults from the ONNX's dynamic inputs.

    parse_shape_specs("input_ids:[1,1],past.3.key:[1,2,0,16]")  -> {"input_ids": (1, 1), ...}
    make_profile(onnx_inputs(path), min_shapes, opt_shapes, max_shapes)
        -> {input name: (min, opt, max)} for every graph input

An input named in any of the three specs takes them; a missing one takes the defaults below,
moved to stay consistent with the given ones (`--trt-max-shapes input_ids:[4,256]` alone gives
min [1, 1], opt [1, 64]), or for a dim without a default a copy of a given one. Every other
input keeps its static dims and gives each symbolic dim the range that dim name got from the
named inputs (so `--trt-max-shapes input_ids:[4,256]` also caps batch at 4 in every past.*
input), else DEFAULT_RANGES by dim name (the exporter names them batch / seq / past). A symbolic
dim with another name needs an explicit spec.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Union

from gdn_export.errors import GdnExportError

Shape = tuple[int, ...]
ShapeSpecs = Union[None, str, Iterable[str], Mapping[str, Iterable[int]]]

# dim name -> (min, opt, max). One profile serves prefill (seq > 1, past = 0) and decode
# (seq = 1, past > 0); opt sits in between so that neither is tuned for an extreme.
DEFAULT_RANGES: dict[str, tuple[int, int, int]] = {
    "batch": (1, 1, 8),
    "seq": (1, 64, 512),
    "past": (0, 256, 2048),
}

_SPEC = re.compile(r"^\s*(?P<name>[^:\s][^:]*?)\s*:\s*\[(?P<dims>[^\]]*)\]\s*$")


@dataclass(frozen=True)
class InputInfo:
    """A graph input: `shape` holds ints (static), dim names (symbolic) or None (unknown)."""

    name: str
    shape: tuple[int | str | None, ...]


def parse_shape_specs(specs: ShapeSpecs, flag: str = "shapes") -> dict[str, Shape]:
    """`name:[d0,d1,...]` specs (one string with several, comma-joined, or a list) or a mapping
    name -> dims into {name: dims}; GdnExportError quoting a malformed spec."""
    if specs is None:
        return {}
    if isinstance(specs, Mapping):
        out = {}
        for name, dims in specs.items():
            try:
                out[str(name)] = tuple(int(d) for d in dims)
            except (TypeError, ValueError):
                raise GdnExportError(f"{flag}: shape of {name!r} must be a list of ints, got {dims!r}") from None
        return out
    if isinstance(specs, str):
        specs = [specs]
    out = {}
    for spec in specs:
        parts = re.findall(r"[^,\[\]]+:\[[^\]]*\]", spec) or [spec]
        for part in parts:
            m = _SPEC.match(part.strip().lstrip(","))
            if m is None:
                raise GdnExportError(f"{flag}: {part!r} is not NAME:[d0,d1,...]")
            try:
                dims = tuple(int(d) for d in m["dims"].replace(" ", "").split(",") if d)
            except ValueError:
                raise GdnExportError(f"{flag}: {part!r} has a dim that is not an integer") from None
            out[m["name"]] = dims
    return out


def _load(onnx_path: str | os.PathLike):
    import onnx

    try:
        return onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:
        raise GdnExportError(f"{onnx_path}: not a readable ONNX file ({type(exc).__name__}: {exc})") from None


def onnx_metadata(onnx_path: str | os.PathLike) -> dict[str, str]:
    """The metadata_props of an ONNX file (gdn_export.* keys: cache_len, kv_cache, ...)."""
    return {p.key: p.value for p in _load(onnx_path).metadata_props}


def onnx_form(onnx_path: str | os.PathLike) -> str:
    """The form of an ONNX file's GDN layers: "gdn", "standard" or "ort" (gdn_export.onnx.forms)."""
    from gdn_export.onnx.forms import form_of

    return form_of(_load(onnx_path))


def onnx_inputs(onnx_path: str | os.PathLike) -> list[InputInfo]:
    """The graph inputs of an ONNX file (initializers excluded), without loading its weights."""
    model = _load(onnx_path)
    initializers = {t.name for t in model.graph.initializer}
    inputs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = []
        for d in value.type.tensor_type.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param") else None)
        inputs.append(InputInfo(value.name, tuple(dims)))
    return inputs


def _default_range(dim, named: dict[str, tuple[int, int, int]],
                   defaults: Mapping[str, tuple[int, int, int]] = DEFAULT_RANGES) -> tuple[int, int, int] | None:
    if isinstance(dim, int) and dim > 0:
        return (dim, dim, dim)
    if isinstance(dim, str):
        return named.get(dim) or defaults.get(dim)
    return None


def _fill(info: InputInfo, given: dict[str, Shape | None],
          defaults: Mapping[str, tuple[int, int, int]] = DEFAULT_RANGES) -> tuple[Shape, Shape, Shape]:
    """min / opt / max of an input named in the specs; missing ones from the dim defaults, kept
    consistent with the given ones (min <= opt <= max), else copied from a given one."""
    copy_order = {"min": ("opt", "max"), "opt": ("max", "min"), "max": ("opt", "min")}
    rank = len(next(s for s in given.values() if s is not None))
    filled = {}
    for which, fallbacks in copy_order.items():
        if given[which] is not None:
            filled[which] = tuple(given[which])
            continue
        copied = next(given[o] for o in fallbacks if given[o] is not None)
        dims = []
        for axis in range(rank):
            default = _default_range(info.shape[axis], {}, defaults) if axis < len(info.shape) else None
            if default is None:
                dims.append(copied[axis])
                continue
            lo = [given[w][axis] for w in ("min", "opt") if given[w] is not None]
            hi = [given[w][axis] for w in ("opt", "max") if given[w] is not None]
            if which == "min":
                dims.append(min([default[0], *hi]))
            elif which == "max":
                dims.append(max([default[2], *lo]))
            else:
                low = given["min"][axis] if given["min"] is not None else min(default[0], given["max"][axis])
                high = given["max"][axis] if given["max"] is not None else max(default[2], given["min"][axis])
                dims.append(min(max(default[1], low), high))
        filled[which] = tuple(dims)
    return filled["min"], filled["opt"], filled["max"]


def _check(info: InputInfo, mn: Shape, opt: Shape, mx: Shape) -> None:
    for which, shape in (("min", mn), ("opt", opt), ("max", mx)):
        if len(shape) != len(info.shape):
            raise GdnExportError(f"--trt-{which}-shapes {info.name}:{list(shape)} has rank {len(shape)}, but "
                                 f"{info.name} has rank {len(info.shape)} {list(info.shape)}")
        for axis, (d, want) in enumerate(zip(shape, info.shape)):
            if isinstance(want, int) and want > 0 and d != want:
                raise GdnExportError(f"--trt-{which}-shapes {info.name}:{list(shape)}: dim {axis} is static "
                                     f"({want}) in the ONNX, got {d}")
            if d < 0:
                raise GdnExportError(f"--trt-{which}-shapes {info.name}:{list(shape)}: dims must be >= 0")
    for axis in range(len(mn)):
        if not mn[axis] <= opt[axis] <= mx[axis]:
            raise GdnExportError(f"{info.name}: dim {axis} needs min <= opt <= max, got min {list(mn)} "
                                 f"opt {list(opt)} max {list(mx)}")


def make_profile(inputs: list[InputInfo], min_shapes: ShapeSpecs = None, opt_shapes: ShapeSpecs = None,
                 max_shapes: ShapeSpecs = None, *,
                 defaults: Mapping[str, tuple[int, int, int]] = DEFAULT_RANGES) -> dict[str, tuple[Shape, Shape, Shape]]:
    """{input: (min, opt, max)} for every input (see module docstring); `defaults` replaces
    DEFAULT_RANGES (dim name -> (min, opt, max))."""
    specs = {"min": parse_shape_specs(min_shapes, "--trt-min-shapes"),
             "opt": parse_shape_specs(opt_shapes, "--trt-opt-shapes"),
             "max": parse_shape_specs(max_shapes, "--trt-max-shapes")}
    by_name = {i.name: i for i in inputs}
    for which, given in specs.items():
        unknown = sorted(set(given) - set(by_name))
        if unknown:
            raise GdnExportError(f"--trt-{which}-shapes names {', '.join(unknown)}, which the ONNX does not have "
                                 f"as inputs (it has {', '.join(by_name) or 'none'})")
    # Inputs named in the specs first: their symbolic dims fix the range of that dim name for the
    # inputs that are not named (TensorRT requires one value per dim name in each of min/opt/max).
    profile, named_ranges, source = {}, {}, {}
    for info in inputs:
        given = {which: specs[which].get(info.name) for which in specs}
        if all(s is None for s in given.values()):
            continue
        mn, opt, mx = _fill(info, given, defaults)
        _check(info, mn, opt, mx)
        profile[info.name] = (tuple(mn), tuple(opt), tuple(mx))
        for axis, d in enumerate(info.shape):
            if isinstance(d, str):
                rng = (mn[axis], opt[axis], mx[axis])
                if named_ranges.setdefault(d, rng) != rng:
                    raise GdnExportError(f"dim '{d}' gets min/opt/max {list(named_ranges[d])} from {source[d]} but "
                                         f"{list(rng)} from {info.name}; give the same values")
                source.setdefault(d, info.name)
    for info in inputs:
        if info.name in profile:
            continue
        dims = []
        for axis, d in enumerate(info.shape):
            if isinstance(d, int) and d > 0:
                dims.append((d, d, d))
            elif isinstance(d, str) and (d in named_ranges or d in defaults):
                dims.append(named_ranges.get(d) or defaults[d])
            else:
                what = f"'{d}'" if isinstance(d, str) else "unnamed"
                raise GdnExportError(
                    f"input {info.name} dim {axis} is dynamic ({what}) with no default range; pass "
                    f"--trt-min-shapes/--trt-opt-shapes/--trt-max-shapes {info.name}:[...]")
        mn, opt, mx = (tuple(r[i] for r in dims) for i in range(3))
        _check(info, mn, opt, mx)
        profile[info.name] = (tuple(mn), tuple(opt), tuple(mx))
    profile = {info.name: profile[info.name] for info in inputs}  # graph order
    return profile


# ------------------------------------------------------------------------ prefill / decode

PREFILL, DECODE = "prefill", "decode"
KEY_CACHE_LEN = "gdn_export.cache_len"
DEFAULT_MAX_BATCH, DEFAULT_MAX_PREFILL, DEFAULT_OPT_PREFILL = 8, 512, 128
Profile = dict[str, tuple[Shape, Shape, Shape]]


def _positive(value, flag: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GdnExportError(f"{flag} must be an integer >= 1, got {value!r}")
    return value


def _dim_range(profile: Profile, inputs: list[InputInfo], dim_name: str) -> tuple[int, int, int] | None:
    for info in inputs:
        for axis, d in enumerate(info.shape):
            if d == dim_name:
                mn, opt, mx = profile[info.name]
                return mn[axis], opt[axis], mx[axis]
    return None


def make_profiles(inputs: list[InputInfo], metadata: Mapping[str, str] | None = None, *,
                  max_batch: int | None = None, max_prefill: int | None = None, decode_batch: int | None = None,
                  min_shapes: ShapeSpecs = None, opt_shapes: ShapeSpecs = None,
                  max_shapes: ShapeSpecs = None) -> dict[str, Profile]:
    """{"prefill": profile, "decode": profile} (profile: {input: (min, opt, max)}, every input).

    prefill: batch 1..max_batch (opt 1), seq 1..max_prefill (opt min(128, max_prefill)), past
        (the growing K/V of the "concat" layout) 0..cache_len (opt 0); the `--trt-*-shapes`
        specs apply to this profile as in `make_profile`.
    decode: seq = 1, batch and past over the prefill profile's ranges (resolved after the specs),
        opt batch = decode_batch (default: the largest batch: decode steps are batched when
        serving), opt past the middle of its range.
    Defaults come from the ONNX metadata (`metadata`, the file's metadata_props):
    gdn_export.cache_len caps max_prefill (default min(512, cache_len)) and the concat layout's
    past (default cache_len, else 2048). A graph whose inputs have no "seq" dim, or whose prefill
    profile is already seq = 1 only, gets the prefill profile alone.
    """
    metadata = metadata or {}
    max_batch = _positive(max_batch, "--max-batch") or DEFAULT_MAX_BATCH
    decode_batch = _positive(decode_batch, "--decode-batch")
    try:
        cache_len = int(metadata.get(KEY_CACHE_LEN, 0)) or None
    except ValueError:
        raise GdnExportError(f"ONNX metadata {KEY_CACHE_LEN} is not an integer: {metadata[KEY_CACHE_LEN]!r}") from None
    max_prefill = _positive(max_prefill, "--max-prefill") or min(DEFAULT_MAX_PREFILL, cache_len or DEFAULT_MAX_PREFILL)
    if cache_len is not None and max_prefill > cache_len:
        raise GdnExportError(f"--max-prefill {max_prefill} exceeds the export's cache length {cache_len}")
    if decode_batch is not None and decode_batch > max_batch:
        raise GdnExportError(f"--decode-batch {decode_batch} exceeds --max-batch {max_batch}")
    max_past = cache_len or DEFAULT_RANGES["past"][2]
    prefill_defaults = {"batch": (1, 1, max_batch), "seq": (1, min(DEFAULT_OPT_PREFILL, max_prefill), max_prefill),
                        "past": (0, 0, max_past)}
    prefill = make_profile(inputs, min_shapes, opt_shapes, max_shapes, defaults=prefill_defaults)
    seq = _dim_range(prefill, inputs, "seq")
    if seq is None or seq[2] == 1:
        return {PREFILL: prefill}
    batch = _dim_range(prefill, inputs, "batch") or (1, 1, 1)
    past = _dim_range(prefill, inputs, "past") or (0, 0, 0)
    opt_batch = min(max(decode_batch or batch[2], batch[0]), batch[2])
    decode_defaults = {"batch": (batch[0], opt_batch, batch[2]), "seq": (1, 1, 1),
                       "past": (past[0], (past[0] + past[2]) // 2, past[2])}
    for info in inputs:  # any other named dim keeps the range the specs gave it
        for d in info.shape:
            if isinstance(d, str) and d not in decode_defaults:
                decode_defaults[d] = _dim_range(prefill, inputs, d)
    return {PREFILL: prefill, DECODE: make_profile(inputs, defaults=decode_defaults)}
