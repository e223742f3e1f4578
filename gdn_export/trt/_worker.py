"""The child process of `build_engine`: parse, configure and build one engine, talk JSON lines.

Run as `python -m gdn_export.trt._worker` with the environment of `loader.build_env()` and a JSON
request on stdin (see build.py). Every line on stdout is one JSON event:

    {"progress": "..."}            a phase message for the user
    {"log": ["W", "..."]}          a TensorRT warning or error
    {"result": {...}}              the engine was written to request["engine_tmp"]
    {"error": "..."}               a one-line user-facing failure (exit status 2)

Nothing else may print to stdout: TensorRT's own C++ chatter goes to stderr.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

import onnx

from gdn_export.errors import GdnExportError
from gdn_export.trt.loader import import_trt

# The gdn plugins: (name, version, namespace). Must match plugins/*/…Plugin.h.
GDN_PLUGINS = (("GatedDeltaRule", "1", "gdn"), ("CausalConv1d", "1", "gdn"), ("MoE", "1", "gdn"))
_OUT = sys.stdout  # replaced in main() by a private copy of fd 1


def emit(**event) -> None:
    _OUT.write(json.dumps(event) + "\n")
    _OUT.flush()


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _make_logger(trt, errors: list[str], layer_info: list[str]):
    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)

        def log(self, severity, msg):
            if "LayerType: " in msg:
                # The built engine's layers (verbose, DETAILED profiling verbosity): the only view
                # of the engine, with the copies TensorRT inserted, where it cannot be deserialized.
                layer_info.append(msg)
            elif severity <= trt.ILogger.Severity.ERROR:
                errors.append(msg)
                emit(log=["E", msg])
            elif severity == trt.ILogger.Severity.WARNING:
                emit(log=["W", msg])

    return Logger()


def _make_monitor(trt):
    if not hasattr(trt, "IProgressMonitor"):
        return None

    class Monitor(trt.IProgressMonitor):
        """Reports the top two levels of TensorRT's build phases."""

        def __init__(self):
            trt.IProgressMonitor.__init__(self)
            self.depth = {}

        def phase_start(self, phase_name, parent_phase, num_steps):
            depth = 0 if parent_phase is None else self.depth.get(parent_phase, 0) + 1
            self.depth[phase_name] = depth
            if depth <= 1:
                emit(progress="  " * depth + f"{phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name, step):
            return True  # never cancel

        def phase_finish(self, phase_name):
            self.depth.pop(phase_name, None)

    return Monitor()


def _gdn_nodes(model: onnx.ModelProto):
    """(node, plugin name, version, namespace) for every node TensorRT will import as a plugin."""
    for node in model.graph.node:
        attrs = {a.name: a for a in node.attribute}
        if node.domain != "gdn" and "plugin_version" not in attrs:
            continue
        version = attrs["plugin_version"].s.decode() if "plugin_version" in attrs else "1"
        namespace = attrs["plugin_namespace"].s.decode() if "plugin_namespace" in attrs else node.domain
        yield node, node.op_type, version, namespace


def _load_plugins(trt, path: str, errors: list[str]):
    registry = trt.get_plugin_registry()
    handle = registry.load_library(path)
    if handle is None:
        detail = f": {_one_line(errors[-1])}" if errors else ""
        raise GdnExportError(f"TensorRT could not load the plugin library {path}{detail}")
    provided = []
    for name, version, namespace in GDN_PLUGINS:
        if registry.get_creator(name, version, namespace) is None:
            raise GdnExportError(f"{path} does not provide the plugin creator {name} version {version!r} "
                                 f"namespace {namespace!r}; rebuild it from this source tree")
        provided.append(f"{name} v{version} ({namespace})")
    return registry, provided


def _check_creators(registry, model: onnx.ModelProto, plugins: str, provided: list[str]) -> None:
    for node, name, version, namespace in _gdn_nodes(model):
        if registry.get_creator(name, version, namespace) is None:
            raise GdnExportError(
                f"no TensorRT plugin creator for node {node.name!r}: {name} version {version!r} namespace "
                f"{namespace!r} (loaded {plugins}, which provides {', '.join(provided)})")


def _parse(trt, builder, onnx_path: str, logger):
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(onnx_path):
        problems = []
        for i in range(parser.num_errors):
            err = parser.get_error(i)
            where = f"node {err.node_name()!r} ({err.node_operator()})" if err.node() >= 0 else "graph"
            problems.append(f"{where}: {_one_line(err.desc())}")
        raise GdnExportError(f"TensorRT's ONNX parser rejected {onnx_path}: " + "; ".join(problems or ["no detail"]))
    return network, parser


_ENGINE_LAYER = re.compile(r"^Name: (?P<name>.*?), LayerType: (?P<type>[^,]*), Inputs: \[(?P<rest>.*)$")
_TENSOR_NAME = re.compile(r"\{ Name: (.*?), ")


def _engine_layers(messages: list[str]) -> list[dict]:
    """{name, type, inputs, outputs} of each engine layer in TensorRT's verbose layer report
    (one "Name: ..., LayerType: ..., Inputs: [...], Outputs: [...], ..." line per layer)."""
    out = []
    for line in (line for msg in messages for line in msg.splitlines()):
        m = _ENGINE_LAYER.match(line.strip())
        if m is None:
            continue
        inputs, _, outputs = m["rest"].partition("Outputs: [")
        outputs = outputs.split("}]", 1)[0]
        out.append({"name": m["name"], "type": m["type"], "inputs": _TENSOR_NAME.findall(inputs),
                    "outputs": _TENSOR_NAME.findall(outputs + ", ")})
    return out


def _allow_decomposed_attention(trt, network) -> int:
    """Let every IAttention fall back to several kernels where TensorRT has no fused one for the
    shape (fp32, head dim 16 of the tiny models: "Attention operation was not supported by a
    dedicated kernel"); a shape with a fused kernel still gets it. Returns how many were set."""
    count = 0
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type.name != "ATTENTION_INPUT":
            continue
        layer.__class__ = trt.IAttentionInputLayer  # the Python API returns ILayer: downcast to reach .attention
        layer.attention.decomposable = True
        count += 1
    return count


def _layers(trt, network, model: onnx.ModelProto) -> list[dict]:
    """The network's layers; plugin layers carry the plugin identity of the ONNX node they came from."""
    plugin_of = {node.name: (name, version, namespace) for node, name, version, namespace in _gdn_nodes(model)}
    out = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        entry = {"name": layer.name, "type": layer.type.name,
                 "inputs": [None if layer.get_input(j) is None else layer.get_input(j).name
                            for j in range(layer.num_inputs)],
                 "outputs": [[layer.get_output(j).name, layer.get_output(j).dtype.name]
                             for j in range(layer.num_outputs)]}
        if layer.type.name == "PLUGIN_V3" and layer.name in plugin_of:
            entry["plugin"] = dict(zip(("name", "version", "namespace"), plugin_of[layer.name]))
        out.append(entry)
    return out


def build(request: dict) -> dict:
    t0 = time.perf_counter()
    trt = import_trt()
    errors: list[str] = []
    layer_info: list[str] = []
    logger = _make_logger(trt, errors, layer_info)
    emit(progress=f"loading {request['plugins']} into {trt.__name__} {trt.__version__}")
    registry, provided = _load_plugins(trt, request["plugins"], errors)

    model = onnx.load(request["onnx"], load_external_data=False)
    _check_creators(registry, model, request["plugins"], provided)
    emit(progress=f"parsing {request['onnx']}")
    builder = trt.Builder(logger)
    # The parser owns the weights the network points at: it must live until the build is done.
    network, parser = _parse(trt, builder, request["onnx"], logger)
    layers = _layers(trt, network, model)
    decomposable = _allow_decomposed_attention(trt, network) if hasattr(trt, "IAttentionInputLayer") else 0
    if decomposable:
        emit(progress=f"{decomposable} attention layers may decompose where no fused kernel fits the shape")

    config = builder.create_builder_config()
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if request.get("workspace"):
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(request["workspace"]))
    if any("plugin" in layer for layer in layers):
        # The gdn plugins update their state input in place (getAliasedInput); TensorRT builds that
        # only with this preview feature on.
        if not hasattr(trt.PreviewFeature, "ALIASED_PLUGIN_IO_10_03"):
            raise GdnExportError(f"{trt.__name__} {trt.__version__} has no ALIASED_PLUGIN_IO preview feature; "
                                 f"the gdn plugins need TensorRT >= 10.3 or TensorRT-RTX")
        config.set_preview_feature(trt.PreviewFeature.ALIASED_PLUGIN_IO_10_03, True)
    monitor = _make_monitor(trt)
    if monitor is not None:
        config.progress_monitor = monitor

    # Profiles in request order: the engine's profile i is request["profiles"][i] (TrtRunner
    # reads the names from the build record).
    for entry in request["profiles"]:
        profile, shapes = builder.create_optimization_profile(), entry["shapes"]
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            if tensor.name not in shapes:
                raise GdnExportError(f"network input {tensor.name} has no shapes in the {entry['name']} profile")
            mn, opt, mx = shapes[tensor.name]
            if tensor.is_shape_tensor:
                raise GdnExportError(f"network input {tensor.name} is a shape tensor; gdn-export graphs have none")
            profile.set_shape(tensor.name, mn, opt, mx)
        config.add_optimization_profile(profile)

    emit(progress=f"building ({network.num_layers} layers, "
                  f"{sum('plugin' in layer for layer in layers)} gdn plugin layers)")
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        detail = _one_line(errors[-1]) if errors else "no error message from TensorRT"
        raise GdnExportError(f"TensorRT could not build the engine: {detail}")
    with open(request["engine_tmp"], "wb") as f:
        f.write(memoryview(serialized))
    del parser
    return {"layers": layers, "engine_layers": _engine_layers(layer_info), "decomposable_attention": decomposable,
            "bytes": serialized.nbytes, "trt": trt.__name__, "trt_version": trt.__version__,
            "seconds": round(time.perf_counter() - t0, 3),
            "inputs": [network.get_input(i).name for i in range(network.num_inputs)],
            "outputs": [network.get_output(i).name for i in range(network.num_outputs)],
            "metadata": {p.key: p.value for p in model.metadata_props}}


def main() -> int:
    global _OUT
    # Events get a private copy of stdout; fd 1 itself then points at stderr, so that whatever
    # native code prints cannot corrupt the JSON stream.
    _OUT = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    request = json.load(sys.stdin)
    try:
        emit(result=build(request))
        return 0
    except GdnExportError as exc:
        emit(error=str(exc))
        return 2


if __name__ == "__main__":
    sys.exit(main())
