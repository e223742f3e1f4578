"""`inspect_engine`: the layers of a built engine, and which of them are gdn plugin layers.

Two sources, best first:
  * TensorRT's engine inspector (IEngineInspector, JSON, DETAILED when built by `build_engine`) on
    the deserialized engine. Deserializing needs a GPU the engine can run on; TensorRT-RTX without
    a GPU fails with "CUDA driver version is insufficient".
  * the build record `<engine>.layers.json` that `build_engine` writes: the network's layers as
    TensorRT parsed them, plugin layers tagged with their plugin name / version / namespace.
Either way the serialized plan is scanned for the plugin names, which TensorRT stores with each
plugin layer (creator lookup at deserialization), as evidence that the plugins made it into the
engine and not only into the network.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from gdn_export.errors import GdnExportError
from gdn_export.trt import loader
from gdn_export.trt.build import layers_path

GDN_PLUGIN_NAMES = ("GatedDeltaRule", "CausalConv1d", "MoE")


@dataclass(frozen=True)
class LayerInfo:
    """One layer: `plugin` is (name, version, namespace) for a gdn plugin layer, else None."""

    name: str
    type: str
    plugin: tuple[str, str, str] | None = None


@dataclass
class EngineLayers:
    engine: Path
    source: str  # "engine inspector" or "build record"
    layers: list[LayerInfo]
    plan_plugin_names: dict[str, int] = field(default_factory=dict)  # name -> occurrences in the plan
    messages: list[str] = field(default_factory=list)  # why the inspector was not used, if it was not

    def plugin_layers(self) -> list[LayerInfo]:
        return [layer for layer in self.layers if layer.plugin is not None]

    def table(self) -> str:
        """A text table of the layers (plugin layers marked)."""
        width = max([len(layer.name) for layer in self.layers] + [5])
        lines = [f"{self.engine} ({self.source}, {len(self.layers)} layers, "
                 f"{len(self.plugin_layers())} gdn plugin layers)",
                 f"{'#':>4}  {'layer':<{width}}  {'type':<16}  plugin"]
        for i, layer in enumerate(self.layers):
            plugin = "" if layer.plugin is None else "{} v{} ({})".format(*layer.plugin)
            lines.append(f"{i:>4}  {layer.name:<{width}}  {layer.type:<16}  {plugin}")
        return "\n".join(lines)


def _scan_plan(data: bytes) -> dict[str, int]:
    return {name: data.count(name.encode()) for name in GDN_PLUGIN_NAMES}


def _from_record(engine_path: Path) -> list[LayerInfo] | None:
    record = layers_path(engine_path)
    if not record.is_file():
        return None
    try:
        entries = json.loads(record.read_text(encoding="utf-8"))["layers"]
    except (ValueError, KeyError) as exc:
        raise GdnExportError(f"{record}: unreadable build record ({exc})") from None
    out = []
    for entry in entries:
        p = entry.get("plugin")
        out.append(LayerInfo(entry["name"], entry["type"],
                             None if p is None else (p["name"], p["version"], p["namespace"])))
    return out


def _from_inspector(data: bytes, plugins: Path, record: list[LayerInfo] | None,
                    messages: list[str]) -> list[LayerInfo] | None:
    trt = loader.import_trt()

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, severity, msg):
            if severity <= trt.ILogger.Severity.ERROR:
                messages.append(msg)

    logger = Logger()
    registry = trt.get_plugin_registry()
    if registry.get_creator(GDN_PLUGIN_NAMES[0], "1", "gdn") is None and registry.load_library(str(plugins)) is None:
        messages.append(f"could not load {plugins}")
        return None
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(data)
    if engine is None:
        return None
    inspector = engine.create_engine_inspector()
    info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    known = {layer.name: layer.plugin for layer in record or [] if layer.plugin is not None}
    out = []
    for entry in info.get("Layers", []):
        if isinstance(entry, str):  # LAYER_NAMES_ONLY verbosity
            out.append(LayerInfo(entry, "?", known.get(entry)))
            continue
        name, kind = entry.get("Name", "?"), str(entry.get("LayerType", "?"))
        plugin = known.get(name)
        if plugin is None and "plugin" in kind.lower():
            text = json.dumps(entry)
            match = next((n for n in GDN_PLUGIN_NAMES if n in text), None)
            plugin = None if match is None else (match, "1", "gdn")
        out.append(LayerInfo(name, kind, plugin))
    return out


def inspect_engine(engine_path: str | os.PathLike, *, plugins: str | os.PathLike | None = None,
                   use_inspector: bool = True) -> EngineLayers:
    """The layers of `engine_path` (see module docstring for the sources)."""
    engine_path = Path(engine_path)
    if not engine_path.is_file():
        raise GdnExportError(f"{engine_path}: no such engine file")
    data = engine_path.read_bytes()
    record = _from_record(engine_path)
    messages: list[str] = []
    layers = None
    if use_inspector:
        layers = _from_inspector(data, loader.find_plugins(plugins), record, messages)
    if layers is not None:
        return EngineLayers(engine_path, "engine inspector", layers, _scan_plan(data))
    if record is None:
        why = f" ({messages[-1]})" if messages else ""
        raise GdnExportError(f"{engine_path}: cannot deserialize the engine here{why} and there is no build "
                             f"record {layers_path(engine_path).name} beside it")
    return EngineLayers(engine_path, "build record", record, _scan_plan(data), messages)


# ------------------------------------------------------------------------------ state aliasing

KV_CACHE, PLUGIN, SEPARATE = "kv_cache", "plugin", "separate"


def _past_name(present: str) -> str:
    return "past" + present[len("present"):]


def state_aliasing(engine_path: str | os.PathLike) -> dict[str, str]:
    """{present.* output: how it relates to its past.* input} in the built engine, from the engine
    layers that `build_engine` recorded (TensorRT's verbose layer report, available without a GPU):

      "kv_cache"  an engine layer reads the present.* tensor itself: the past.* input was folded
                  into it (the KV cache update writes in place), so input and output MUST be one
                  buffer (TensorRT also reports it through ICudaEngine.get_aliased_input_tensor)
      "plugin"    past.* is read only by the layer that writes present.* (a gdn plugin with aliased
                  I/O; TensorRT inserted no copy): one buffer for both updates it in place
      "separate"  anything else (past.* has other readers, or a copy layer writes present.*):
                  input and output need their own buffers
    Empty when the record has no engine layers (built by an older gdn-export, or a TensorRT whose
    verbose log has no layer report).
    """
    record = layers_path(engine_path)
    if not record.is_file():
        return {}
    data = json.loads(record.read_text(encoding="utf-8"))
    layers = data.get("engine_layers") or []
    if not layers:
        return {}
    out = {}
    for present in (o for o in data.get("outputs", []) if o.startswith("present.")):
        past = _past_name(present)
        # By name: the report repeats the layers once per optimisation profile.
        readers = {layer["name"] for layer in layers if past in layer["inputs"]}
        writers = {layer["name"] for layer in layers if present in layer["outputs"]}
        if any(present in layer["inputs"] for layer in layers) and not readers:
            out[present] = KV_CACHE
        elif len(readers) == 1 and writers == readers:
            out[present] = PLUGIN
        else:
            out[present] = SEPARATE
    return out
