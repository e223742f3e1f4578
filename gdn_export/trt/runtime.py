"""TrtRunner: a gdn-export engine on a CUDA GPU behind `gdn_export.runtime.base.Runner`.

    runner = TrtRunner("model.engine", plugins="plugins/build/libgdn_plugins.so")
    states = runner.empty_states(B)
    logits, states = runner.forward(ids, past_lengths, seq_lens, states)   # ids [B, T] int64, rows right-padded
        past_lengths [B] int64: tokens each row has seen; seq_lens [B]: real new tokens (1 .. T)
        logits [B, 1, V] fp32 (last real token of each row), or [B, T, V] for gdn_export.logits = "all"

What it does, and why:
  * One buffer per state, allocated once for the largest batch, bound once: its address never
    changes, so `set_tensor_address` is not repeated. Input past.* and output present.* get the SAME
    address where the engine updates the state in place: the KV cache update (TensorScatter ->
    KV_CACHE_UPDATE) requires it (`ICudaEngine.get_aliased_input_tensor`, TensorRT >= 10.15 and
    TensorRT-RTX), and a gdn plugin state qualifies when the built engine reads past.* only in the
    plugin that writes present.* (the build record's engine layers, `inspect.state_aliasing`: TensorRT
    inserted no copy, and the plugins are correct in place). Anything else (the growing K/V of the
    "concat" layout, an engine without the record on a TensorRT without the alias query) gets two
    buffers that swap roles each step (ping-pong): no copy of ours either way.
  * Its own CUDA stream (not the legacy default stream, which synchronises the whole device per call),
    ordered against the caller's current stream with events: the step waits for the caller's earlier
    work, and the caller's later work waits for the step.
  * Two optimisation profiles ("prefill" and "decode", seq = 1; `build_engine`), the one that fits
    chosen per call (`set_optimization_profile_async` on the runner's stream, only on a change; after a
    change every shape and address is set again).
  * Checks at load: the engine was built by this TensorRT flavour and version (build record), it has
    the gdn-export inputs / outputs with the expected dtypes; before each run: the lengths, the state
    handle (only the states returned by the latest call, or `empty_states`, are valid: the buffers are
    updated in place), and every output shape TensorRT infers (no -1, logits and present.* as expected)
    before any buffer is bound.
  * TensorRT-RTX runtime config set deliberately: dynamic-shape kernel specialisation `lazy` by default
    (RTX compiles a kernel specialised to each new shape in the background and uses its generic kernel
    until then; "eager" compiles before the first run of each shape, which blocks once per new prompt
    length; "none" keeps the generic kernels), CUDA graph capture off (shapes change per call).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gdn_export.errors import GdnExportError, InputError
from gdn_export.onnx.metadata import KEY_SPECULATIVE_ROLE
from gdn_export.runtime.base import BATCH, PAST, Runner, StateInfo, check_states
from gdn_export.trt import loader
from gdn_export.trt.build import layers_path
from gdn_export.trt.inspect import KV_CACHE, PLUGIN, state_aliasing

INPUT_IDS, PAST_LENGTHS, SEQ_LENS, LOGITS = "input_ids", "past_lengths", "seq_lens", "logits"
TOKEN_INPUTS = (INPUT_IDS, PAST_LENGTHS, SEQ_LENS)
SPECIALIZATIONS = ("lazy", "eager", "none")
_STATE_NAME = re.compile(r"^past\.(?P<layer>\d+)\.(?P<kind>conv|recurrent|key|value)$")
_KEY_STATES, _KEY_VOCAB = "gdn_export.state_specs", "gdn_export.vocab_size"
_KEY_LAYOUT, _KEY_LOGITS = "gdn_export.kv_cache", "gdn_export.logits"


@dataclass
class TrtStates:
    """Opaque state handle: device views in `state_specs` order, valid for one forward.
    seen [B] int64: tokens each row has been through (the next call's past_lengths)."""

    tensors: list
    batch: int
    seen: np.ndarray
    generation: int


@dataclass(frozen=True)
class _Profile:
    index: int
    name: str
    ranges: dict  # input name -> (min, max) shapes


def _dtype_name(torch_dtype) -> str:
    return str(torch_dtype).removeprefix("torch.")


class TrtRunner(Runner):
    """Run `engine_path` (built by `build_engine`) with the plugins of `plugins` on `device`.

    kernel_specialization: TensorRT-RTX's dynamic-shape kernel strategy, "lazy" | "eager" | "none"
        (ignored by TensorRT 10/11, which has none). trt / cuda: stand-ins of the TensorRT module and
        of `_cuda.TorchCuda` (tests run the runner on CPU with them).
    """

    backend = "trt"

    def __init__(self, engine_path: str | os.PathLike, *, plugins: str | os.PathLike | None = None,
                 device: int | str | None = None, kernel_specialization: str = "lazy", trt=None, cuda=None):
        if kernel_specialization not in SPECIALIZATIONS:
            raise InputError(f"kernel_specialization must be one of {', '.join(SPECIALIZATIONS)}, "
                             f"got {kernel_specialization!r}")
        if cuda is None:
            from gdn_export.trt._cuda import TorchCuda

            cuda = TorchCuda(device)
        self._cuda = cuda
        self.path = Path(engine_path)
        if not self.path.is_file():
            raise InputError(f"{self.path}: no such engine file")
        trt = trt or loader.import_trt()
        self._trt = trt
        self._record = self._read_record()
        role = self._record.get("metadata", {}).get(KEY_SPECULATIVE_ROLE)
        if role is not None:
            raise InputError(f"{self.path}: an engine of the {role} graph of `export --speculative`, which runs "
                             f"inside speculative decoding, not alone; build and run the model's graph")
        self._check_builder(trt)
        self._errors: list[str] = []
        self._logger = self._make_logger(trt)
        registry = trt.get_plugin_registry()
        if registry.get_creator("GatedDeltaRule", "1", "gdn") is None:
            library = loader.find_plugins(plugins)
            loader.check_loads(library)
            if registry.load_library(str(library)) is None:
                raise GdnExportError(f"TensorRT could not load the plugin library {library}")
        with cuda.scope():
            self._runtime = trt.Runtime(self._logger)
            self.engine = self._runtime.deserialize_cuda_engine(self.path.read_bytes())
            if self.engine is None:
                raise GdnExportError(f"{self.path}: TensorRT could not deserialize the engine: {self._last_error()}")
            self.context = self._create_context(trt, kernel_specialization)
        self.kernel_specialization = kernel_specialization
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self._inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        metadata = self._record.get("metadata", {})
        self._check_io()
        self.state_specs = self._state_specs(metadata)
        self.layout = self._layout(metadata)
        self.vocab_size = self._vocab_size(metadata)
        logits_seq = int(self.engine.get_tensor_shape(LOGITS)[1])
        self.logits_mode = metadata.get(_KEY_LOGITS) or ("last" if logits_seq == 1 else "all")
        self.cache_len = next((int(s.shape[2]) for s in self.state_specs
                               if s.kind == "key" and isinstance(s.shape[2], int)), None)  # inplace layout
        self._profiles = self._read_profiles()
        self._stream = cuda.new_stream()
        self._allocate()
        self._active: int | None = None  # the context's optimisation profile
        self._addresses: dict[str, int] = {}  # what set_tensor_address last got, per tensor
        self._shapes: dict[str, tuple] = {}  # what set_input_shape last got, per input
        self._generation = 0

    # ------------------------------------------------------------------------------ set-up

    def _make_logger(self, trt):
        errors = self._errors

        class Logger(trt.ILogger):
            def __init__(self):
                trt.ILogger.__init__(self)

            def log(self, severity, msg):
                if severity <= trt.ILogger.Severity.ERROR:
                    errors.append(msg)

        return Logger()

    def _last_error(self) -> str:
        return " ".join(self._errors[-1].split()) if self._errors else "no message from TensorRT"

    def _read_record(self) -> dict:
        path = layers_path(self.path)
        if not path.is_file():
            return {}
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            raise GdnExportError(f"{path}: unreadable build record; rebuild the engine") from None

    def _check_builder(self, trt) -> None:
        # TensorRT refuses an engine of another version at deserialization, but with a message that
        # does not say which; the record names both. Without a record TensorRT's check is all there is.
        built = (self._record.get("trt"), self._record.get("trt_version"))
        if built[0] is None:
            return
        here = (trt.__name__, trt.__version__)
        if built != here:
            raise GdnExportError(f"{self.path} was built by {built[0]} {built[1]}, this is {here[0]} {here[1]}: "
                                 f"rebuild it with `gdn-export build` here")

    def _create_context(self, trt, strategy: str):
        enum = getattr(trt, "DynamicShapesKernelSpecializationStrategy", None)
        if enum is None or not hasattr(self.engine, "create_runtime_config"):
            context = self.engine.create_execution_context()  # TensorRT 10/11: no JIT kernels to configure
        else:
            self._runtime_config = config = self.engine.create_runtime_config()  # must outlive the context
            config.dynamic_shapes_kernel_specialization_strategy = getattr(enum, strategy.upper())
            if hasattr(trt, "CudaGraphStrategy"):
                config.cuda_graph_strategy = trt.CudaGraphStrategy.DISABLED
            context = self.engine.create_execution_context(config)
        if context is None:
            raise GdnExportError(f"{self.path}: TensorRT could not create an execution context: {self._last_error()}")
        return context

    def _check_io(self) -> None:
        trt = self._trt
        missing = [n for n in TOKEN_INPUTS if n not in self._inputs] + \
                  [n for n in (LOGITS,) if n not in self._outputs]
        if missing:
            old = " (an engine of the old position_ids graph: re-export and rebuild)" \
                if "position_ids" in self._inputs else ""
            raise GdnExportError(f"{self.path}: not a gdn-export engine, it has no {', '.join(missing)}{old}")
        want = {INPUT_IDS: trt.DataType.INT64, PAST_LENGTHS: trt.DataType.INT64, SEQ_LENS: trt.DataType.INT64,
                LOGITS: trt.DataType.FLOAT}
        for name, dtype in want.items():
            if self.engine.get_tensor_dtype(name) != dtype:
                raise GdnExportError(f"{self.path}: {name} is {self.engine.get_tensor_dtype(name)}, expected {dtype}")
        if len(tuple(self.engine.get_tensor_shape(LOGITS))) != 3:
            raise GdnExportError(f"{self.path}: logits must be [batch, seq or 1, vocab], got "
                                 f"{list(self.engine.get_tensor_shape(LOGITS))}")

    def _layout(self, metadata: dict):
        """The DeployLayout recorded by the export (gdn_export.onnx.metadata); an engine without the
        record is read from its shapes: a static key length is the in-place layout."""
        from gdn_export.layout import DeployLayout
        from gdn_export.onnx.metadata import read_layout

        if _KEY_LAYOUT in metadata:
            return read_layout(metadata)
        key = next((s for s in self.state_specs if s.kind == "key"), None)
        if key is None or not isinstance(key.shape[2], int):
            return DeployLayout.make(kv_cache="concat", logits="all")
        logits = "last" if int(self.engine.get_tensor_shape(LOGITS)[1]) == 1 else "all"
        return DeployLayout.make(cache_len=int(key.shape[2]), logits=logits)

    def _state_specs(self, metadata: dict) -> list[StateInfo]:
        if _KEY_STATES in metadata:
            specs = [StateInfo(d["name"], d["output"], tuple(d["shape"]), d["dtype"], int(d["layer"]), d["kind"])
                     for d in json.loads(metadata[_KEY_STATES])]
        else:
            specs = []  # only batch (axis 0) and past are dynamic in a gdn-export state
            for name in self._inputs:
                m = _STATE_NAME.match(name)
                if m is not None:
                    dims = tuple(self.engine.get_tensor_shape(name))
                    shape = tuple(BATCH if (d < 0 and axis == 0) else PAST if d < 0 else int(d)
                                  for axis, d in enumerate(dims))
                    specs.append(StateInfo(name, "present" + name[len("past"):], shape,
                                           _dtype_name(self._torch_dtype(name)), int(m["layer"]), m["kind"]))
        for spec in specs:
            if spec.name not in self._inputs or spec.output_name not in self._outputs:
                raise GdnExportError(f"{self.path}: engine has no input {spec.name} / output {spec.output_name}")
            if _dtype_name(self._torch_dtype(spec.name)) != spec.dtype:
                raise GdnExportError(f"{self.path}: {spec.name} is {_dtype_name(self._torch_dtype(spec.name))} "
                                     f"in the engine, {spec.dtype} in the ONNX metadata")
        return specs

    def _torch_dtype(self, name: str):
        import torch

        trt = self._trt
        table = {trt.DataType.FLOAT: torch.float32, trt.DataType.HALF: torch.float16,
                 trt.DataType.BF16: torch.bfloat16, trt.DataType.INT32: torch.int32, trt.DataType.INT64: torch.int64}
        dtype = self.engine.get_tensor_dtype(name)
        if dtype not in table:
            raise GdnExportError(f"{self.path}: {name} is {dtype}, which the TensorRT runner does not support")
        return table[dtype]

    def _vocab_size(self, metadata: dict) -> int:
        v = int(self.engine.get_tensor_shape(LOGITS)[-1])
        if v <= 0:
            v = int(metadata.get(_KEY_VOCAB, 0))
        if v <= 0:
            raise GdnExportError(f"{self.path}: cannot tell the vocab size from logits")
        return v

    def _read_profiles(self) -> list[_Profile]:
        count = self.engine.num_optimization_profiles
        names = [p.get("name", str(i)) for i, p in enumerate(self._record.get("profiles", []))]
        out = []
        for i in range(count):
            ranges = {}
            for name in [INPUT_IDS] + [s.name for s in self.state_specs]:
                mn, _, mx = (tuple(int(d) for d in s) for s in self.engine.get_tensor_profile_shape(name, i))
                ranges[name] = (mn, mx)
            default = "decode" if ranges[INPUT_IDS][1][1] == 1 else "prefill"
            out.append(_Profile(i, names[i] if len(names) == count else default, ranges))
        if not out:
            raise GdnExportError(f"{self.path}: the engine has no optimisation profile")
        return out

    def _allocate(self) -> None:
        cuda = self._cuda
        self.max_batch = max(p.ranges[INPUT_IDS][1][0] for p in self._profiles)
        self.max_seq = max(p.ranges[INPUT_IDS][1][1] for p in self._profiles)
        self.max_past = 0
        for spec in self.state_specs:
            if PAST in spec.shape:
                axis = spec.shape.index(PAST)
                self.max_past = max([self.max_past] + [p.ranges[spec.name][1][axis] for p in self._profiles])
        self._ids = cuda.zeros(self.max_batch * self.max_seq, self._torch_dtype(INPUT_IDS))
        self._past = cuda.zeros(self.max_batch, self._torch_dtype(PAST_LENGTHS))
        self._lens = cuda.zeros(self.max_batch, self._torch_dtype(SEQ_LENS))
        rows = self.max_seq if self.logits_mode == "all" else 1
        self._logits = cuda.zeros(self.max_batch * rows * self.vocab_size, self._torch_dtype(LOGITS))
        aliasing = state_aliasing(self.path)
        query = getattr(self.engine, "get_aliased_input_tensor", None)  # TensorRT >= 10.15, TensorRT-RTX
        self.in_place: list[bool] = []
        self._buffers, self._slot = [], []
        for spec in self.state_specs:
            reported = query is not None and query(spec.output_name) == spec.name
            one = reported or (PAST not in spec.shape and aliasing.get(spec.output_name) in (KV_CACHE, PLUGIN))
            if aliasing.get(spec.output_name) == KV_CACHE and query is not None and not reported:
                raise GdnExportError(f"{self.path}: the build record says {spec.output_name} is a KV cache updated "
                                     f"in place, but TensorRT does not alias it to {spec.name}")
            # Largest shape either role can take: in the concat layout present has past + seq positions.
            numel = int(np.prod(spec.concrete_shape(self.max_batch, self.max_past + self.max_seq)))
            dtype = self._torch_dtype(spec.name)
            self._buffers.append([cuda.zeros(numel, dtype) for _ in range(1 if one else 2)])
            self.in_place.append(one)
            self._slot.append(0)

    # ------------------------------------------------------------------------------ Runner

    def empty_states(self, batch: int) -> TrtStates:
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or not 1 <= batch <= self.max_batch:
            raise InputError(f"batch {batch!r} is outside the engine's profiles (1 .. {self.max_batch})")
        cuda, caller = self._cuda, self._cuda.current_stream()
        tensors = []
        with cuda.on(self._stream):
            cuda.wait(self._stream, caller)
            for i, spec in enumerate(self.state_specs):
                self._slot[i] = 0
                self._buffers[i][0].zero_()  # whole buffer: a K/V cache slot past a row's length is masked, not stale
                tensors.append(self._view(i, 0, spec.concrete_shape(batch, 0)))
        cuda.wait(caller, self._stream)
        self._generation += 1
        return TrtStates(tensors, int(batch), np.zeros(batch, np.int64), self._generation)

    def _forward(self, input_ids: np.ndarray, past_lengths, seq_lens, states) -> tuple[np.ndarray, TrtStates]:
        if not isinstance(states, TrtStates) or states.generation != self._generation:
            raise InputError("TensorRT states are updated in place: pass the states returned by the latest "
                             "forward / empty_states of this runner")
        # Runner.forward checked the lengths against input_ids and the layout (check_lengths,
        # check_fits); what is left is what only the states can say.
        batch, seq = input_ids.shape
        past, lens = past_lengths, seq_lens
        if states.batch != batch:
            raise InputError(f"the states are for batch {states.batch}, input_ids has {batch} rows")
        if not np.array_equal(past, states.seen):
            raise InputError(f"past_lengths {past.tolist()} do not match the states, which have seen "
                             f"{states.seen.tolist()} tokens")
        p_len = int(past[0]) if not self.layout.inplace else 0
        check_states(self.state_specs, [(tuple(t.shape), _dtype_name(t.dtype)) for t in states.tensors],
                     batch, p_len)
        profile = self._choose_profile(batch, seq, p_len)
        cuda, caller = self._cuda, self._cuda.current_stream()
        handle = cuda.handle(self._stream)
        self._errors.clear()
        with cuda.on(self._stream):
            cuda.wait(self._stream, caller)  # the caller's writes to inputs / states come first
            if profile.index != self._active:
                if not self.context.set_optimization_profile_async(profile.index, handle):
                    raise GdnExportError(f"{self.path}: TensorRT could not switch to the {profile.name} profile: "
                                         f"{self._last_error()}")
                self._active = profile.index
                self._shapes.clear()  # set every shape and address again for the new profile
                self._addresses.clear()
            cuda.upload(self._ids[: batch * seq].view(batch, seq), input_ids)
            cuda.upload(self._past[:batch], past)
            cuda.upload(self._lens[:batch], lens)
            self._set_shape(INPUT_IDS, (batch, seq), profile)
            self._set_shape(PAST_LENGTHS, (batch,), profile)
            self._set_shape(SEQ_LENS, (batch,), profile)
            extra = {name: self._extra_view(name, value)  # inputs between the tokens and the states
                     for name, value in self._extra_inputs(input_ids, past, lens).items()}
            for name, view in extra.items():
                self._set_shape(name, tuple(view.shape), profile)
            for spec, t in zip(self.state_specs, states.tensors):
                self._set_shape(spec.name, tuple(t.shape), profile)
            outputs = self._output_views(batch, seq, p_len)  # checks every inferred shape first
            tokens = [(INPUT_IDS, self._ids), (PAST_LENGTHS, self._past), (SEQ_LENS, self._lens)]
            for name, view in [*tokens, *extra.items(),
                               *((s.name, t) for s, t in zip(self.state_specs, states.tensors)), *outputs.items()]:
                self._bind(name, view)
            if not self.context.execute_async_v3(handle):
                raise GdnExportError(f"{self.path}: TensorRT execution failed: {self._last_error()}")
            logits = cuda.to_host(outputs[LOGITS])  # blocks until the step is done
        cuda.wait(caller, self._stream)  # the caller's later work on the states comes after
        for i in range(len(self.state_specs)):
            if not self.in_place[i]:
                self._slot[i] = 1 - self._slot[i]
        self._generation += 1
        new = [outputs[s.output_name] for s in self.state_specs]
        return logits, TrtStates(new, batch, past + lens, self._generation)

    # ------------------------------------------------------------------------------ helpers

    def _extra_inputs(self, input_ids, past_lengths, seq_lens) -> dict[str, np.ndarray]:
        """Host arrays of the inputs between the token inputs and the states (none here; the
        vision-language runner, gdn_export.vlm.runner, feeds its visual inputs)."""
        return {}

    def _extra_view(self, name: str, value: np.ndarray):
        """`value` uploaded into this input's device buffer (allocated once, at the largest shape of
        any profile, at least one element); returns the view of value's shape."""
        buffers = self.__dict__.setdefault("_extra_buffers", {})
        if name not in buffers:
            largest = max(int(np.prod(self.engine.get_tensor_profile_shape(name, i)[2]))
                          for i in range(self.engine.num_optimization_profiles))
            buffers[name] = self._cuda.zeros(max(largest, 1), self._torch_dtype(name))
        if value.size > buffers[name].numel():
            raise InputError(f"{name} of shape {list(value.shape)} exceeds the engine's profiles")
        view = buffers[name][: value.size].view(value.shape)
        if value.size:
            self._cuda.upload(view, value)
        return view

    def _choose_profile(self, batch: int, seq: int, past: int) -> _Profile:
        def fits(p: _Profile) -> bool:
            (mn, mx) = p.ranges[INPUT_IDS]
            if not (mn[0] <= batch <= mx[0] and mn[1] <= seq <= mx[1]):
                return False
            for spec in self.state_specs:
                if PAST in spec.shape:
                    axis = spec.shape.index(PAST)
                    lo, hi = p.ranges[spec.name][0][axis], p.ranges[spec.name][1][axis]
                    if not lo <= past <= hi:
                        return False
            return True

        fitting = [p for p in self._profiles if fits(p)]
        if not fitting:
            have = "; ".join(f"{p.name}: input_ids {list(p.ranges[INPUT_IDS][0])} .. {list(p.ranges[INPUT_IDS][1])}"
                             for p in self._profiles)
            raise InputError(f"batch {batch}, seq {seq}" + (f", past {past}" if not self.layout.inplace else "")
                             + f" fits none of the engine's profiles ({have})")
        # The narrowest profile in seq: decode steps (seq = 1) run on the decode profile.
        return min(fitting, key=lambda p: (p.ranges[INPUT_IDS][1][1], p.index))

    def _set_shape(self, name: str, shape: tuple, profile: _Profile) -> None:
        if self._shapes.get(name) == shape:
            return
        if not self.context.set_input_shape(name, shape):
            raise InputError(f"{name} shape {list(shape)} is outside the engine's {profile.name} profile: "
                             f"{self._last_error()}")
        self._shapes[name] = shape

    def _output_views(self, batch: int, seq: int, past: int) -> dict:
        rows = seq if self.logits_mode == "all" else 1
        want = {LOGITS: (batch, rows, self.vocab_size)}
        for spec in self.state_specs:
            want[spec.output_name] = spec.concrete_shape(batch, past + seq)
        views = {}
        for name, shape in want.items():
            got = tuple(int(d) for d in self.context.get_tensor_shape(name))
            if got != shape:
                raise GdnExportError(f"{self.path}: TensorRT infers {name} {list(got)} for these inputs, expected "
                                     f"{list(shape)}: {self._last_error()}")
        views[LOGITS] = self._logits[: int(np.prod(want[LOGITS]))].view(want[LOGITS])
        for i, spec in enumerate(self.state_specs):
            slot = 0 if self.in_place[i] else 1 - self._slot[i]
            views[spec.output_name] = self._view(i, slot, want[spec.output_name])
        return views

    def _view(self, i: int, slot: int, shape: tuple):
        return self._buffers[i][slot][: int(np.prod(shape))].view(shape)

    def _bind(self, name: str, view) -> None:
        # Views start at their buffer's first element, so the address of a tensor changes only
        # with the ping-pong slot (never for in-place states): most calls bind nothing new.
        address = view.untyped_storage().data_ptr()
        if self._addresses.get(name) == address:
            return
        if not self.context.set_tensor_address(name, address):
            raise GdnExportError(f"{self.path}: TensorRT refused the address of {name}: {self._last_error()}")
        self._addresses[name] = address

    def states_to_numpy(self, states) -> dict[str, np.ndarray]:
        if not isinstance(states, TrtStates):
            raise InputError(f"expected TrtStates, got {type(states).__name__}")
        caller = self._cuda.current_stream()
        with self._cuda.on(self._stream):
            self._cuda.wait(self._stream, caller)
            return {spec.name: self._cuda.to_host(t) for spec, t in zip(self.state_specs, states.tensors)}
