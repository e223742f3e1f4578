"""`build_engine`: ONNX with gdn nodes -> serialized TensorRT engine using libgdn_plugins.so.

The engine is strongly typed (every tensor keeps the dtype the ONNX gives it), the gdn plugin
layers update their state inputs in place (ALIASED_PLUGIN_IO preview feature), the attention
layers (ONNX Attention -> IAttention) may decompose where TensorRT has no fused kernel for the
shape, and two optimisation profiles are built, "prefill" (profile 0) and "decode" (profile 1,
seq = 1) (`gdn_export.trt.profile.make_profiles`).

The build itself runs in a child process (`gdn_export.trt._worker`) whose environment is set up
before it starts (`loader.build_env`, needed by TensorRT-RTX); the child reports progress and
errors as JSON lines. The engine is written to a temporary name beside the target and renamed
into place, together with `<engine>.layers.json`: the network's layers at build time (the only
layer list available where the engine cannot be deserialized, e.g. TensorRT-RTX without a GPU),
the built engine's layers as TensorRT's verbose build log reports them ("engine_layers": which
layer reads and writes which tensor, copies included), the profiles by name, the TensorRT flavour
and version that built it (TrtRunner refuses another), and the ONNX's metadata_props (state
layout, vocab size) for `TrtRunner`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Callable

from gdn_export.errors import GdnExportError
from gdn_export.paths import publish_files
from gdn_export.trt import kv_fp8, loader
from gdn_export.trt.profile import ShapeSpecs, make_profiles, onnx_form, onnx_inputs, onnx_metadata

LAYERS_SUFFIX = ".layers.json"
ENGINE_SUFFIXES = (".engine", ".plan", ".trt")  # how `run` tells an engine file


def check_buildable_form(onnx_path: str | os.PathLike) -> None:
    """GdnExportError naming the ort form, which TensorRT cannot build: it has no com.microsoft
    GatedDeltaNet / VarlenCausalConvWithState / GatedRMSNorm, and the ort form keeps no record of the
    gdn nodes it replaced (the gdn and standard forms build)."""
    from gdn_export.onnx.forms import ORT

    if onnx_form(onnx_path) == ORT:
        raise GdnExportError(f"{onnx_path} is the ort form (com.microsoft.GatedDeltaNet, VarlenCausalConvWithState, "
                             f"GatedRMSNorm), which only ONNX Runtime runs: TensorRT has no such ops and the form "
                             f"cannot be rewritten back to gdn nodes; export with --onnx-ops gdn (the default) "
                             f"or standard for TensorRT")


def layers_path(engine_path: str | os.PathLike) -> Path:
    """Where `build_engine` records the network's layers for `engine_path`."""
    engine_path = Path(engine_path)
    return engine_path.with_name(engine_path.name + LAYERS_SUFFIX)


def record_metadata(engine_path: str | os.PathLike) -> dict[str, str]:
    """The ONNX metadata_props that `engine_path`'s build record keeps ({} without a readable record)."""
    try:
        record = json.loads(layers_path(engine_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record.get("metadata") or {}


def _run_worker(request: dict, say: Callable[[str], None], timeout: float | None) -> dict:
    cmd = [sys.executable, "-m", "gdn_export.trt._worker"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=loader.build_env(), text=True)
    stderr_tail: deque[str] = deque(maxlen=20)

    def drain_stderr():
        for line in proc.stderr:
            stderr_tail.append(line.rstrip())

    reader = threading.Thread(target=drain_stderr, daemon=True)
    reader.start()
    proc.stdin.write(json.dumps(request))
    proc.stdin.close()
    # The read loop below blocks until the child closes stdout, so the time limit needs its own
    # thread: it kills the child, which ends the loop.
    expired = threading.Event()
    timer = None
    if timeout is not None:
        timer = threading.Timer(timeout, lambda: (expired.set(), proc.kill()))
        timer.daemon = True
        timer.start()
    result, error, last_log = None, None, None
    try:
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                stderr_tail.append(line.rstrip())
                continue
            if "progress" in event:
                say(event["progress"])
            elif "log" in event:
                severity, message = event["log"]
                last_log = message
                if severity == "E":
                    say(f"TensorRT error: {message}")
            elif "result" in event:
                result = event["result"]
            elif "error" in event:
                error = event["error"]
        proc.wait()
    finally:
        if timer is not None:
            timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
    if expired.is_set() and result is None:
        raise GdnExportError(f"the TensorRT build did not finish within {timeout} s")
    if error is not None:
        raise GdnExportError(error)
    if proc.returncode != 0 or result is None:
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
        detail = next((l for l in reversed(stderr_tail) if l.strip()), None) or last_log or "no message"
        raise GdnExportError(f"the TensorRT build process died ({how}): {detail}")
    return result


def check_exported(onnx_path: str | os.PathLike, what: str | None = None) -> None:
    """InputError unless `onnx_path` is a graph `gdn-export export` wrote, told from its metadata and
    I/O names alone (no weights read): metadata_props carry gdn_export.version, the inputs start with
    input_ids, past_lengths, seq_lens and the first output is logits (what `run` and `validate`
    need of an engine). A vision-language export's vision graph is named as such: build its
    model.onnx, which builds both engines. The graphs of `export --speculative K` (verify form and
    MTP head, told by their metadata) pass as they are. `build_engine` itself builds any ONNX graph."""
    import onnx

    from gdn_export.errors import InputError
    from gdn_export.onnx.export import LOGITS, TOKEN_INPUTS
    from gdn_export.onnx.metadata import KEY_SPECULATIVE_ROLE, KEY_VERSION, KEY_VLM_ROLE

    what = what or str(onnx_path)
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError, an OSError
        raise InputError(f"{what}: not a readable ONNX file ({type(exc).__name__})") from None
    meta = {p.key: p.value for p in model.metadata_props}
    inputs = [v.name for v in model.graph.input if v.name not in {t.name for t in model.graph.initializer}]
    outputs = [v.name for v in model.graph.output]
    hint = "build takes the .onnx that `gdn-export export` writes"
    if KEY_VERSION not in meta:
        producer = f" (producer {model.producer_name!r})" if model.producer_name else ""
        raise InputError(f"{what}: not a gdn-export export{producer}: its metadata has no {KEY_VERSION}; {hint}")
    if meta.get(KEY_VLM_ROLE) == "vision":
        raise InputError(f"{what}: the vision graph of a vision-language export; build its language graph "
                         f"(model.onnx), which builds both engines")
    if meta.get(KEY_SPECULATIVE_ROLE) in ("verify", "mtp"):
        return
    if tuple(inputs[:len(TOKEN_INPUTS)]) != TOKEN_INPUTS or outputs[:1] != [LOGITS]:
        raise InputError(f"{what}: not a gdn-export graph of this release: inputs {', '.join(inputs[:3]) or 'none'}"
                         f" and output {', '.join(outputs[:1]) or 'none'}, where `run` and `validate` need inputs "
                         f"{', '.join(TOKEN_INPUTS)} and output {LOGITS}; export the checkpoint again")


def build_engine(
    onnx_path: str | os.PathLike,
    engine_path: str | os.PathLike,
    *,
    plugins: str | os.PathLike | None = None,
    min_shapes: ShapeSpecs = None,
    opt_shapes: ShapeSpecs = None,
    max_shapes: ShapeSpecs = None,
    max_batch: int | None = None,
    max_prefill: int | None = None,
    decode_batch: int | None = None,
    workspace: int | None = None,
    progress: Callable[[str], None] | None = None,
    timeout: float | None = None,
    overwrite: bool = True,
) -> Path:
    """Build `engine_path` from `onnx_path`; returns the engine's path.

    plugins: libgdn_plugins.so (default: $GDN_EXPORT_PLUGINS, then plugins/build/).
    min/opt/max_shapes: {input: dims} or trtexec-style "name:[d0,d1,...]" specs of the prefill
        profile; inputs not named get defaults from their dim names (batch 1..max_batch, seq
        1..max_prefill, past 0..cache_len).
    max_batch, max_prefill, decode_batch: the profiles' limits (`profile.make_profiles`: default
        8, min(512, cache_len), max_batch); the decode profile is the prefill one with seq = 1.
    workspace: workspace memory pool limit in bytes (default: TensorRT's).
    progress: called with one line per build phase.
    overwrite False: an engine (or its build record) that appeared at `engine_path` while this one
        was built is kept and the build ends in an OutputError (gdn_export.paths.publish_files).
    Raises GdnExportError (one line) for a missing plugin library, a node whose plugin creator is
    not registered, an ONNX the parser rejects (naming the nodes), bad shapes, a failed build.
    """
    say = progress or (lambda _msg: None)
    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    if not onnx_path.is_file():
        raise GdnExportError(f"{onnx_path}: no such ONNX file")
    if not engine_path.parent.is_dir():
        raise GdnExportError(f"{engine_path.parent}: output folder does not exist")
    if engine_path.is_dir():
        raise GdnExportError(f"{engine_path}: is a folder")
    if workspace is not None and workspace <= 0:
        raise GdnExportError(f"workspace must be a positive number of bytes, got {workspace}")
    check_buildable_form(onnx_path)
    kv_fp8.check(onnx_path, onnx_metadata(onnx_path), loader.flavour())  # before any work
    library = loader.find_plugins(plugins)
    loader.check_loads(library)  # before the first progress line, not in the build's child
    profiles = make_profiles(onnx_inputs(onnx_path), onnx_metadata(onnx_path), max_batch=max_batch,
                             max_prefill=max_prefill, decode_batch=decode_batch, min_shapes=min_shapes,
                             opt_shapes=opt_shapes, max_shapes=max_shapes)
    for which, profile in profiles.items():
        for name, (mn, opt, mx) in profile.items():
            if mn != mx:
                say(f"{which} profile {name}: min {list(mn)} opt {list(opt)} max {list(mx)}")

    from gdn_export.onnx.standard_ops import gdn_form_file  # imports torch: not in the build's child

    with gdn_form_file(onnx_path, say) as parse_path:  # a standard-form file: its gdn form
        return _build(onnx_path, parse_path, engine_path, library, profiles, workspace, say, timeout, overwrite)


def _build(onnx_path, parse_path, engine_path, library, profiles, workspace, say, timeout, overwrite):
    tmp = engine_path.with_name(f".{engine_path.name}.{os.getpid()}.tmp")
    tmp_layers = tmp.with_name(tmp.name + LAYERS_SUFFIX)
    request = {"onnx": str(parse_path.resolve()), "engine_tmp": str(tmp), "plugins": str(library),
               "profiles": [{"name": which, "shapes": {k: [list(s) for s in v] for k, v in profile.items()}}
                            for which, profile in profiles.items()],
               "workspace": workspace}
    try:
        result = _run_worker(request, say, timeout)
        record = {"trt": result["trt"], "trt_version": result["trt_version"], "onnx": str(onnx_path),
                  "inputs": result["inputs"], "outputs": result["outputs"], "metadata": result["metadata"],
                  "profiles": request["profiles"], "decomposable_attention": result["decomposable_attention"],
                  "layers": result["layers"], "engine_layers": result["engine_layers"]}
        tmp_layers.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        publish_files([(tmp, engine_path), (tmp_layers, layers_path(engine_path))], overwrite=overwrite)
    finally:
        tmp.unlink(missing_ok=True)
        tmp_layers.unlink(missing_ok=True)
    size_mib = result["bytes"] / 2**20
    say(f"wrote {engine_path} ({size_mib:.1f} MiB, {result['trt']} {result['trt_version']}, "
        f"{result['seconds']:.1f} s)")
    return engine_path
