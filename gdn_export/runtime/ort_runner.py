"""OrtRunner: an exported .onnx file in ONNX Runtime (states are numpy arrays).

The file holds bare gdn.* nodes (what TensorRT maps to plugins), their standard form or the ort
form (gdn_export.onnx.forms). At load time the runner rewrites the GDN layers of the first two to
ORT's com.microsoft LinearAttention / CausalConvWithState kernels, or, where none applies, attaches
standard-ONNX bodies of the gdn ops as model-local functions; the ort form runs as it is, on ORT's
GatedDeltaNet / VarlenCausalConvWithState / GatedRMSNorm kernels, and an ORT without them is
refused at load (gdn_export.onnx.ort_native; `kernels` / `kernels_note` say which and why); nothing
is written over the file and no compiled custom-op library is needed.

Steps run through an IOBinding. With the in-place K/V cache each present.{i}.key / .value output is
bound to its past.* input's own buffer, which ORT's TensorScatter then updates in place (it copies
the cache only when the two differ): the cache arrays are written in place, never copied per step.
The GDN conv / recurrent states (small, constant size) come back as new arrays. States are
therefore consumed by `forward`: pass the returned ones to the next call.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from gdn_export.errors import GdnExportError, InputError
from gdn_export.onnx import metadata
from gdn_export.onnx.export import INPUT_IDS, LOGITS, TOKEN_INPUTS
from gdn_export.onnx import bf16, kv_fp8_ort, ort_native
from gdn_export.runtime.base import Runner, StateInfo, check_states
from gdn_export.runtime.ort_log import OrtLog

_STATE_NAME = re.compile(r"^past\.(?P<layer>\d+)\.(?P<kind>conv|recurrent|key|value)$")
_NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64}
FP8_NAME = "float8_e4m3fn"


def _elem_name(elem_type: int) -> str:
    """onnx.TensorProto.FLOAT16 -> "float16" (the names StateInfo uses)."""
    if elem_type == onnx.TensorProto.BFLOAT16:
        return "bfloat16"
    return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name


def _shape(value: onnx.ValueInfoProto) -> tuple[int | str, ...]:
    return tuple(d.dim_param if d.HasField("dim_param") else d.dim_value
                 for d in value.type.tensor_type.shape.dim)


def read_state_specs(model: onnx.ModelProto, token_inputs: tuple[str, ...] = TOKEN_INPUTS) -> list[StateInfo]:
    """State specs from the graph I/O (past.* inputs, present.* outputs in the same order),
    cross-checked with the layout recorded in metadata_props when the file has one.
    token_inputs: the inputs before the states (a vision-language graph has more)."""
    inputs, outputs = list(model.graph.input), list(model.graph.output)
    first = len(token_inputs)
    if tuple(v.name for v in inputs[:first]) != token_inputs or \
            [v.name for v in outputs[:1]] != [LOGITS] or len(inputs) != len(outputs) + first - 1:
        raise InputError(f"not a gdn-export graph of this release: expected inputs "
                         f"{', '.join(token_inputs)}, past.* and outputs logits, present.* (files "
                         f"exported before 0.2 have position_ids: export them again)")
    specs = []
    for inp, out in zip(inputs[first:], outputs[1:]):
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
    token_inputs = TOKEN_INPUTS  # the graph inputs before the states

    def __init__(self, onnx_path: str | os.PathLike,
                 providers: Sequence[str] | None = None, session_options=None,
                 kernels: str = "auto", device: str = "cpu", device_buffers: bool | None = None):
        """`device` "cpu" or "cuda[:N]" (onnxruntime-gpu's CUDAExecutionProvider; providers then
        default to it, CPU as fallback); `kernels` "auto" | "native" | "functions" (ort_native);
        `device_buffers` (default: device is not the CPU) keeps states as OrtValues on the device:
        K/V caches updated in place, the GDN states written into a second buffer each step and
        swapped (no allocation, no host copy)."""
        import onnxruntime as ort

        from gdn_export.runtime import ort_device

        self.device = device
        self.ort_log = OrtLog()  # ONNX Runtime's warnings, counted: `ort_log.summary()`
        self._ort_device = ort_device.parse_device(device)
        if providers is None:
            providers = ort_device.providers_for(self._ort_device)
        self.device_buffers = self._ort_device[0] != "cpu" if device_buffers is None else device_buffers
        self._spare: dict[str, object] = {}

        self.path = Path(onnx_path)
        if not self.path.is_file():
            raise InputError(f"{self.path}: no such ONNX file")
        try:
            model = onnx.load(str(self.path), load_external_data=False)
        except DecodeError as exc:
            raise InputError(f"{self.path}: not an ONNX model (protobuf could not parse it: {exc})") from None
        except OSError as exc:
            raise InputError(f"{self.path}: cannot read ({exc.strerror})") from None
        role = {p.key: p.value for p in model.metadata_props}.get(metadata.KEY_SPECULATIVE_ROLE)
        if role is not None:
            raise InputError(f"{self.path}: the {role} graph of `export --speculative`, which runs inside "
                             f"speculative decoding, not alone; run the model's graph, or the checkpoint with "
                             f"--speculative K (`gdn-export validate CHECKPOINT --onnx {self.path.name}` checks it)")
        try:
            self.state_specs = read_state_specs(model, self.token_inputs)
            ort_native.check_runnable(model, kernels, providers)  # an ort form ORT lacks: before any work
        except GdnExportError as exc:
            raise InputError(f"{self.path}: {exc}") from None
        self.metadata = {p.key: p.value for p in model.metadata_props}
        try:
            self.layout = metadata.read_layout(self.metadata)
        except (GdnExportError, KeyError, ValueError) as exc:
            raise InputError(f"{self.path}: unreadable gdn_export layout metadata ({exc})") from None
        logits_dims = _shape(model.graph.output[0])
        vocab = logits_dims[-1] if logits_dims else None
        if not isinstance(vocab, int) or vocab <= 0:
            vocab = int(self.metadata.get(metadata.KEY_VOCAB, 0))
        if vocab <= 0:
            raise InputError(f"{self.path}: cannot tell the vocab size (logits shape {logits_dims})")
        self.vocab_size = vocab
        for spec in self.state_specs:
            if spec.dtype not in (*_NUMPY_DTYPES, "bfloat16", FP8_NAME):
                raise InputError(f"{self.path}: state {spec.name} is {spec.dtype}; the ONNX Runtime "
                                 f"runner handles float32 / float16 / bfloat16 graphs (and float8_e4m3fn K/V caches)")
        # bf16 tensors run as fp32 holding bf16 values, rounded where the graph rounds (onnx/bf16.py);
        # the runner's states are then fp32 arrays (`run_specs`) holding bf16 values.
        self.bf16_emulated = bf16.has_bf16(model)
        # FP8 K/V caches run as fp32 arrays holding the e4m3 values (gdn_export.onnx.kv_fp8_ort).
        self.run_specs = [replace(s, dtype="float32") if s.dtype in ("bfloat16", FP8_NAME) else s
                          for s in self.state_specs]
        external = _uses_external_data(model)
        if self.bf16_emulated:
            if external:
                onnx.load_external_data_for_model(model, str(self.path.parent))
            model = bf16.emulate_bf16(model)
        if kv_fp8_ort.has_fp8_cache(model):
            model = kv_fp8_ort.emulate_fp8_cache(model)
        # Native com.microsoft kernels where they apply, else function bodies (gdn_export.onnx.ort_native).
        plan = ort_native.prepare(model, kernels, providers=list(providers))
        self.kernels = plan.kernels
        self.kernels_note = plan.note + ("; bf16 tensors as fp32 rounded to bf16" if self.bf16_emulated else "")
        full = plan.model
        options = session_options or ort.SessionOptions()
        # ORT fuses INT4 DequantizeLinear -> MatMul into MatMulNBits, which by default (level 4)
        # quantizes the activations to int8; level 0 keeps the W4A16 arithmetic of the graph.
        options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
        if self.bf16_emulated and external:
            # The fp32 weights of the emulation: a temporary folder with its own sidecar.
            with tempfile.TemporaryDirectory(prefix=f".{self.path.stem}.", dir=self.path.parent) as tmp:
                onnx.save(full, f"{tmp}/m.onnx", save_as_external_data=True, location="m.onnx.data")
                with self.ort_log.capture():
                    self.session = ort.InferenceSession(f"{tmp}/m.onnx", options, providers=list(providers))
        elif external:
            # External data resolves relative to the model file: the session must load a file
            # beside it. The copy with functions attached lives only until the session is built.
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.stem}.", suffix=".ort.onnx",
                                       dir=self.path.parent)
            os.close(fd)
            try:
                onnx.save(full, tmp)
                with self.ort_log.capture():
                    self.session = ort.InferenceSession(tmp, options, providers=list(providers))
            finally:
                Path(tmp).unlink(missing_ok=True)
        else:
            with self.ort_log.capture():
                self.session = ort.InferenceSession(full.SerializeToString(), options,
                                                    providers=list(providers))
        self._output_names = [LOGITS, *(s.output_name for s in self.state_specs)]

    def empty_states(self, batch: int) -> list:
        """Zero states: numpy arrays, or OrtValues on the device with `device_buffers`."""
        zeros = [np.zeros(s.concrete_shape(batch, 0), _NUMPY_DTYPES[s.dtype]) for s in self.run_specs]
        if not self.device_buffers:
            return zeros
        import onnxruntime as ort

        self._spare.clear()
        kind, index = self._ort_device
        return [ort.OrtValue.ortvalue_from_numpy(z, kind, index) for z in zeros]

    def _forward(self, input_ids: np.ndarray, past_lengths: np.ndarray, seq_lens: np.ndarray, states):
        import onnxruntime as ort

        if self.device_buffers:
            from gdn_export.runtime.ort_device import forward_on_device

            return forward_on_device(self, input_ids, past_lengths, seq_lens, states)

        states = [np.ascontiguousarray(s) for s in states]
        batch, seq = input_ids.shape
        check_states(self.run_specs, [(s.shape, s.dtype.name) for s in states], batch,
                     int(past_lengths[0]))
        binding = self.session.io_binding()
        for name, value in zip(TOKEN_INPUTS, (input_ids, past_lengths, seq_lens)):
            binding.bind_cpu_input(name, np.ascontiguousarray(value, dtype=np.int64))
        for name, value in self._extra_inputs(input_ids, past_lengths, seq_lens).items():
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
        binding.bind_output(LOGITS)
        in_place = self.layout.inplace
        for spec, state in zip(self.state_specs, states):
            if in_place and spec.kind in ("key", "value"):
                # One OrtValue over the array, as input and output: TensorScatter writes in place.
                value = ort.OrtValue.ortvalue_from_numpy(state)
                binding.bind_ortvalue_input(spec.name, value)
                binding.bind_ortvalue_output(spec.output_name, value)
            else:
                binding.bind_cpu_input(spec.name, state)
                binding.bind_output(spec.output_name)
        with self.ort_log.capture():
            self.session.run_with_iobinding(binding)
        outputs = dict(zip(self._output_names, binding.get_outputs()))
        new_states = [state if in_place and spec.kind in ("key", "value")
                      else outputs[spec.output_name].numpy()
                      for spec, state in zip(self.state_specs, states)]
        logits = outputs[LOGITS].numpy()
        return logits.astype(np.float32, copy=False), new_states

    def _extra_inputs(self, input_ids, past_lengths, seq_lens) -> dict[str, np.ndarray]:
        """Inputs between the token inputs and the states (none here; gdn_export.vlm.runner's
        vision-language runner feeds its visual inputs)."""
        return {}

    def states_to_numpy(self, states) -> dict[str, np.ndarray]:
        """Copies: the runner updates the K/V arrays in place on the next step."""
        return {spec.name: (s.numpy() if hasattr(s, "numpy") else np.array(s))
                for spec, s in zip(self.state_specs, states)}
