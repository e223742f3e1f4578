"""TrtRunner: a gdn-export engine on a CUDA GPU behind `gdn_export.runtime.base.Runner`.

    runner = TrtRunner("model.engine", plugins="plugins/build/libgdn_plugins.so")
    states = runner.empty_states(B)
    logits, states = runner.forward(ids, 0, states)          # prefill, ids [B, T] int64
    logits, states = runner.forward(next_ids, T, states)     # decode, next_ids [B, 1]

Memory is allocated once, for the profile's largest batch / sequence / past (torch CUDA tensors):
each state gets one buffer when the engine aliases its present.* output to its past.* input
(`ICudaEngine.get_aliased_input_tensor`, TensorRT >= 10.15 and TensorRT-RTX), else two that
alternate as input and output (ping-pong; the growing key / value caches, and every state on an
older TensorRT). A step binds views of those buffers with `set_tensor_address` and runs
`execute_async_v3` on torch's current stream. States are therefore consumed by `forward`: only
the states returned by the latest call (or `empty_states`) may be passed to the next one; older
ones raise InputError.

State specs come from the ONNX metadata recorded beside the engine by `build_engine`
(`<engine>.layers.json`), else from the engine's past.* / present.* tensors.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gdn_export.errors import GdnExportError, InputError
from gdn_export.runtime.base import BATCH, PAST, Runner, StateInfo, check_states
from gdn_export.trt import loader
from gdn_export.trt.build import layers_path

INPUT_IDS, POSITION_IDS, LOGITS = "input_ids", "position_ids", "logits"
_STATE_NAME = re.compile(r"^past\.(?P<layer>\d+)\.(?P<kind>conv|recurrent|key|value)$")
_KEY_STATES = "gdn_export.state_specs"
_KEY_VOCAB = "gdn_export.vocab_size"


@dataclass
class TrtStates:
    """Opaque state handle: CUDA tensor views in `state_specs` order, valid for one forward."""

    tensors: list
    batch: int
    past: int
    generation: int


def _torch_dtype(trt, dtype):
    import torch

    table = {trt.DataType.FLOAT: torch.float32, trt.DataType.HALF: torch.float16,
             trt.DataType.BF16: torch.bfloat16, trt.DataType.INT32: torch.int32,
             trt.DataType.INT64: torch.int64}
    if dtype not in table:
        raise GdnExportError(f"engine tensor dtype {dtype} is not supported by the TensorRT runner")
    return table[dtype]


def _dtype_name(torch_dtype) -> str:
    return str(torch_dtype).removeprefix("torch.")


class TrtRunner(Runner):
    """Run `engine_path` (built by `build_engine`) with the plugins of `plugins` on `device`."""

    backend = "trt"

    def __init__(self, engine_path: str | os.PathLike, *, plugins: str | os.PathLike | None = None,
                 device: int | str | None = None):
        import torch

        if not torch.cuda.is_available():
            raise GdnExportError("the TensorRT runner needs a CUDA GPU (torch.cuda.is_available() is False)")
        self.path = Path(engine_path)
        if not self.path.is_file():
            raise InputError(f"{self.path}: no such engine file")
        dev = torch.device(f"cuda:{device}" if isinstance(device, int) else device or "cuda")
        if dev.type != "cuda":
            raise InputError(f"the TensorRT runner runs on a CUDA device, got {device!r}")
        self.device = dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())
        trt = loader.import_trt()
        self._trt = trt
        self._errors: list[str] = []
        self._logger = self._make_logger(trt)
        registry = trt.get_plugin_registry()
        library = loader.find_plugins(plugins)
        if registry.get_creator("GatedDeltaRule", "1", "gdn") is None and registry.load_library(str(library)) is None:
            raise GdnExportError(f"TensorRT could not load the plugin library {library}")
        with torch.cuda.device(self.device):
            self._runtime = trt.Runtime(self._logger)
            self.engine = self._runtime.deserialize_cuda_engine(self.path.read_bytes())
            if self.engine is None:
                raise GdnExportError(f"{self.path}: TensorRT could not deserialize the engine: {self._last_error()}")
            self.context = self.engine.create_execution_context()
            if self.context is None:
                raise GdnExportError(f"{self.path}: TensorRT could not create an execution context: "
                                     f"{self._last_error()}")
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self._inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        record = self._read_record()
        self.state_specs = self._state_specs(record)
        self.vocab_size = self._vocab_size(record)
        self._allocate()

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
            return json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
        except ValueError:
            return {}

    def _state_specs(self, metadata: dict) -> list[StateInfo]:
        if _KEY_STATES in metadata:
            specs = [StateInfo(d["name"], d["output"], tuple(d["shape"]), d["dtype"], int(d["layer"]), d["kind"])
                     for d in json.loads(metadata[_KEY_STATES])]
        else:
            # Only batch (axis 0) and past are dynamic in a gdn-export state.
            specs = []
            for name in self._inputs:
                m = _STATE_NAME.match(name)
                if m is None:
                    continue
                dims = tuple(self.engine.get_tensor_shape(name))
                shape = tuple(BATCH if (d < 0 and axis == 0) else PAST if d < 0 else int(d)
                              for axis, d in enumerate(dims))
                dtype = _dtype_name(_torch_dtype(self._trt, self.engine.get_tensor_dtype(name)))
                specs.append(StateInfo(name, "present" + name[len("past"):], shape, dtype,
                                       int(m["layer"]), m["kind"]))
        for spec in specs:
            if spec.name not in self._inputs or spec.output_name not in self._outputs:
                raise GdnExportError(f"{self.path}: engine has no input {spec.name} / output {spec.output_name}")
        return specs

    def _vocab_size(self, metadata: dict) -> int:
        if LOGITS not in self._outputs or INPUT_IDS not in self._inputs:
            raise GdnExportError(f"{self.path}: not a gdn-export engine (inputs {self._inputs}, outputs {self._outputs})")
        v = int(self.engine.get_tensor_shape(LOGITS)[-1])
        if v <= 0:
            v = int(metadata.get(_KEY_VOCAB, 0))
        if v <= 0:
            raise GdnExportError(f"{self.path}: cannot tell the vocab size from logits")
        return v

    def _profile_max(self, name: str):
        return tuple(self.engine.get_tensor_profile_shape(name, 0)[2])

    def _aliased_input(self, output_name: str) -> str | None:
        # ICudaEngine.get_aliased_input_tensor exists from TensorRT 10.15 (and in TensorRT-RTX);
        # older engines report no aliasing and get ping-pong buffers.
        query = getattr(self.engine, "get_aliased_input_tensor", None)
        return None if query is None else query(output_name)

    def _allocate(self) -> None:
        import torch

        ids_max = self._profile_max(INPUT_IDS)
        self.max_batch, self.max_seq = int(ids_max[0]), int(ids_max[1])
        self.max_past = 0
        for spec in self.state_specs:
            if PAST in spec.shape:
                self.max_past = max(self.max_past, int(self._profile_max(spec.name)[spec.shape.index(PAST)]))
        dev = self.device
        self._ids = torch.zeros(self.max_batch * self.max_seq, dtype=_torch_dtype(
            self._trt, self.engine.get_tensor_dtype(INPUT_IDS)), device=dev)
        self._pos = None
        if POSITION_IDS in self._inputs:
            self._pos = torch.zeros_like(self._ids, dtype=_torch_dtype(
                self._trt, self.engine.get_tensor_dtype(POSITION_IDS)))
        self._logits_dtype = _torch_dtype(self._trt, self.engine.get_tensor_dtype(LOGITS))
        self._logits = torch.empty(self.max_batch * self.max_seq * self.vocab_size, dtype=self._logits_dtype,
                                   device=dev)
        self._in_place, self._buffers, self._slot = [], [], []
        for spec in self.state_specs:
            aliased = self._aliased_input(spec.output_name) == spec.name
            # Largest shape either role can take: present has past + seq positions.
            numel = int(np.prod(spec.concrete_shape(self.max_batch, self.max_past + self.max_seq)))
            dtype = getattr(torch, spec.dtype)
            count = 1 if aliased else 2
            self._buffers.append([torch.zeros(max(numel, 1), dtype=dtype, device=dev) for _ in range(count)])
            self._in_place.append(aliased)
            self._slot.append(0)
        self._generation = 0

    # ------------------------------------------------------------------------------ Runner

    def empty_states(self, batch: int) -> TrtStates:
        if not 1 <= batch <= self.max_batch:
            raise InputError(f"batch {batch} is outside the engine's profile (1 .. {self.max_batch})")
        tensors = []
        for i, spec in enumerate(self.state_specs):
            self._slot[i] = 0
            shape = spec.concrete_shape(batch, 0)
            view = self._buffers[i][0][: int(np.prod(shape))].view(shape)
            view.zero_()
            tensors.append(view)
        self._generation += 1
        return TrtStates(tensors, batch, 0, self._generation)

    def _forward(self, input_ids: np.ndarray, past_len: int, states) -> tuple[np.ndarray, TrtStates]:
        import torch

        if not isinstance(states, TrtStates) or states.generation != self._generation:
            raise InputError("TensorRT states are updated in place: pass the states returned by the latest "
                             "forward / empty_states of this runner")
        batch, seq = input_ids.shape
        check_states(self.state_specs, [(tuple(t.shape), _dtype_name(t.dtype)) for t in states.tensors],
                     batch, past_len)
        if batch > self.max_batch or seq > self.max_seq:
            raise InputError(f"input_ids {input_ids.shape} exceeds the engine's profile "
                             f"(batch <= {self.max_batch}, seq <= {self.max_seq})")
        if past_len > self.max_past and any(PAST in s.shape for s in self.state_specs):
            raise InputError(f"past length {past_len} exceeds the engine's profile (<= {self.max_past})")
        self._errors.clear()
        with torch.cuda.device(self.device):
            stream = torch.cuda.current_stream(self.device)
            ids = self._ids[: batch * seq].view(batch, seq)
            ids.copy_(torch.from_numpy(np.ascontiguousarray(input_ids)))
            self._set_input(INPUT_IDS, ids)
            if self._pos is not None:
                pos = self._pos[: batch * seq].view(batch, seq)
                pos.copy_(torch.arange(past_len, past_len + seq, device=self.device).expand(batch, seq))
                self._set_input(POSITION_IDS, pos)
            for spec, t in zip(self.state_specs, states.tensors):
                self._set_input(spec.name, t)
            logits = self._logits[: batch * seq * self.vocab_size].view(batch, seq, self.vocab_size)
            self._bind(LOGITS, logits)
            new_tensors = []
            for i, (spec, t) in enumerate(zip(self.state_specs, states.tensors)):
                shape = tuple(self.context.get_tensor_shape(spec.output_name))
                if self._in_place[i]:
                    out = self._buffers[i][0][: int(np.prod(shape))].view(shape)
                else:
                    out = self._buffers[i][1 - self._slot[i]][: int(np.prod(shape))].view(shape)
                self._bind(spec.output_name, out)
                new_tensors.append(out)
            if not self.context.execute_async_v3(stream.cuda_stream):
                raise GdnExportError(f"{self.path}: TensorRT execution failed: {self._last_error()}")
            result = logits.float().cpu().numpy()  # synchronises the stream
        for i in range(len(self.state_specs)):
            if not self._in_place[i]:
                self._slot[i] = 1 - self._slot[i]
        self._generation += 1
        return result, TrtStates(new_tensors, batch, past_len + seq, self._generation)

    def _set_input(self, name: str, view) -> None:
        if not self.context.set_input_shape(name, tuple(view.shape)):
            mn, _, mx = (tuple(d) for d in self.engine.get_tensor_profile_shape(name, 0))
            raise InputError(f"{name} shape {tuple(view.shape)} is outside the engine's profile "
                             f"(min {list(mn)}, max {list(mx)}): {self._last_error()}")
        self._bind(name, view)

    def _bind(self, name: str, view) -> None:
        if not self.context.set_tensor_address(name, self._base(view)):
            raise GdnExportError(f"{self.path}: TensorRT refused the address of {name}: {self._last_error()}")

    @staticmethod
    def _base(view) -> int:
        # A zero-size view (P = 0 caches) still gets the buffer's non-null address.
        return view.data_ptr() or view.untyped_storage().data_ptr()

    def states_to_numpy(self, states) -> dict[str, np.ndarray]:
        if not isinstance(states, TrtStates):
            raise InputError(f"expected TrtStates, got {type(states).__name__}")
        return {spec.name: (t.float() if _dtype_name(t.dtype) == "bfloat16" else t).cpu().numpy()
                for spec, t in zip(self.state_specs, states.tensors)}
