"""OrtRunner: an exported .onnx file in ONNX Runtime (states are numpy arrays).

The file holds bare gdn.* nodes (what TensorRT maps to plugins). At load time the runner attaches
standard-ONNX bodies of those ops as model-local functions (gdn_export.onnx.functions), which ORT
inlines; nothing is written over the file and no compiled custom-op library is needed.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from gdn_export.errors import InputError
from gdn_export.onnx import metadata
from gdn_export.onnx.export import INPUT_IDS, LOGITS, POSITION_IDS
from gdn_export.onnx.functions import attach_reference_functions
from gdn_export.runtime.base import Runner, StateInfo, check_states

_STATE_NAME = re.compile(r"^past\.(?P<layer>\d+)\.(?P<kind>conv|recurrent|key|value)$")
_NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64}


def _elem_name(elem_type: int) -> str:
    """onnx.TensorProto.FLOAT16 -> "float16" (the names StateInfo uses)."""
    if elem_type == onnx.TensorProto.BFLOAT16:
        return "bfloat16"
    return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name


def _shape(value: onnx.ValueInfoProto) -> tuple[int | str, ...]:
    return tuple(d.dim_param if d.HasField("dim_param") else d.dim_value
                 for d in value.type.tensor_type.shape.dim)


def read_state_specs(model: onnx.ModelProto) -> list[StateInfo]:
    """State specs from the graph I/O (past.* inputs, present.* outputs in the same order),
    cross-checked with the layout recorded in metadata_props when the file has one."""
    inputs, outputs = list(model.graph.input), list(model.graph.output)
    if [v.name for v in inputs[:2]] != [INPUT_IDS, POSITION_IDS] or \
            [v.name for v in outputs[:1]] != [LOGITS] or len(inputs) != len(outputs) + 1:
        raise InputError("not a gdn-export graph: expected inputs input_ids, position_ids, past.* "
                         "and outputs logits, present.*")
    specs = []
    for inp, out in zip(inputs[2:], outputs[1:]):
        m = _STATE_NAME.match(inp.name)
        if m is None or out.name != "present" + inp.name[len("past"):]:
            raise InputError(f"not a gdn-export graph: state input {inp.name!r} / output {out.name!r}")
        dtype = _elem_name(inp.type.tensor_type.elem_type)
        specs.append(StateInfo(inp.name, out.name, _shape(inp), dtype, int(m["layer"]), m["kind"]))
    recorded = metadata.read_state_layouts({p.key: p.value for p in model.metadata_props})
    if recorded is not None:
        got = [(s.name, s.output_name, s.shape, s.dtype) for s in specs]
        want = [(r.name, r.output, r.shape, r.dtype) for r in recorded]
        if got != want:
            raise InputError(f"the graph's state inputs disagree with its {metadata.KEY_STATES} metadata")
    return specs


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


class OrtRunner(Runner):
    """Run the exported `onnx_path` with ONNX Runtime `providers`."""

    backend = "ort"

    def __init__(self, onnx_path: str | os.PathLike,
                 providers: Sequence[str] = ("CPUExecutionProvider",), session_options=None):
        import onnxruntime as ort

        self.path = Path(onnx_path)
        if not self.path.is_file():
            raise InputError(f"{self.path}: no such ONNX file")
        try:
            model = onnx.load(str(self.path), load_external_data=False)
        except DecodeError as exc:
            raise InputError(f"{self.path}: not an ONNX model (protobuf could not parse it: {exc})") from None
        except OSError as exc:
            raise InputError(f"{self.path}: cannot read ({exc.strerror})") from None
        try:
            self.state_specs = read_state_specs(model)
        except InputError as exc:
            raise InputError(f"{self.path}: {exc}") from None
        self.metadata = {p.key: p.value for p in model.metadata_props}
        logits_dims = _shape(model.graph.output[0])
        vocab = logits_dims[-1] if logits_dims else None
        if not isinstance(vocab, int) or vocab <= 0:
            vocab = int(self.metadata.get(metadata.KEY_VOCAB, 0))
        if vocab <= 0:
            raise InputError(f"{self.path}: cannot tell the vocab size (logits shape {logits_dims})")
        self.vocab_size = vocab
        for spec in self.state_specs:
            if spec.dtype not in _NUMPY_DTYPES:
                raise InputError(f"{self.path}: state {spec.name} is {spec.dtype}; the ONNX Runtime "
                                 f"runner handles float32 / float16 graphs")
        full = attach_reference_functions(model)
        options = session_options or ort.SessionOptions()
        if _uses_external_data(model):
            # External data resolves relative to the model file: the session must load a file
            # beside it. The copy with functions attached lives only until the session is built.
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.stem}.", suffix=".ort.onnx",
                                       dir=self.path.parent)
            os.close(fd)
            try:
                onnx.save(full, tmp)
                self.session = ort.InferenceSession(tmp, options, providers=list(providers))
            finally:
                Path(tmp).unlink(missing_ok=True)
        else:
            self.session = ort.InferenceSession(full.SerializeToString(), options,
                                                providers=list(providers))
        self._output_names = [LOGITS, *(s.output_name for s in self.state_specs)]

    def empty_states(self, batch: int) -> list[np.ndarray]:
        return [np.zeros(s.concrete_shape(batch, 0), _NUMPY_DTYPES[s.dtype]) for s in self.state_specs]

    def _forward(self, input_ids: np.ndarray, past_len: int, states):
        states = [np.asarray(s) for s in states]
        batch, seq = input_ids.shape
        check_states(self.state_specs, [(s.shape, s.dtype.name) for s in states], batch, past_len)
        positions = np.broadcast_to(np.arange(past_len, past_len + seq, dtype=np.int64), (batch, seq))
        feeds = {INPUT_IDS: input_ids, POSITION_IDS: np.ascontiguousarray(positions)}
        feeds.update({spec.name: np.ascontiguousarray(s) for spec, s in zip(self.state_specs, states)})
        logits, *new_states = self.session.run(self._output_names, feeds)
        return logits.astype(np.float32, copy=False), new_states

    def states_to_numpy(self, states) -> dict[str, np.ndarray]:
        return {spec.name: np.asarray(s) for spec, s in zip(self.state_specs, states)}
