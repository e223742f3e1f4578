"""ONNX Runtime on a GPU (onnxruntime-gpu's CUDAExecutionProvider) and IOBinding on device buffers.

    parse_device("cuda:1") -> ("cuda", 1); providers_for(...) -> the session's providers, or one
    InputError line when onnxruntime-gpu or a GPU is missing.
    forward_on_device(runner, ...)  one OrtRunner step with every state an OrtValue on the device:
        the in-place K/V caches are bound as input and output of the same buffer (TensorScatter
        writes in place; a concat-layout cache grows and ORT allocates it on the device), the conv / recurrent states are written into the runner's spare buffer of the same
        shape, which then swaps with the input (two buffers a state, no allocation per step).
        Token inputs are copied from the host (a few bytes), logits come back to the host.

The same path runs on the CPU provider (OrtValues in host memory), which is how it is tested
without a GPU.
"""

from __future__ import annotations

import numpy as np

from gdn_export.errors import InputError
from gdn_export.runtime.base import check_states

_ELEM_NAMES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16"}
INSTALL_HINT = ("pip install onnxruntime-gpu (in place of onnxruntime: the two packages cannot share "
                "one environment) and the CUDA 13 libraries (e.g. the nvidia-*-cu13 wheels torch "
                "brings, found by onnxruntime.preload_dlls())")


def parse_device(device: str, flag: str = "--device") -> tuple[str, int]:
    """("cpu", 0) or ("cuda", N) from "cpu" / "cuda" / "cuda:N"; InputError otherwise."""
    if device == "cpu":
        return "cpu", 0
    kind, colon, index = device.partition(":")
    if kind == "cuda" and (index.isdigit() or not colon):
        return "cuda", int(index or 0)
    raise InputError(f"{flag} {device!r}: ONNX Runtime runs on cpu, cuda or cuda:N")


def providers_for(ort_device: tuple[str, int], flag: str = "--device") -> list:
    """The providers of a session on `ort_device`; InputError (one line) when CUDA is asked for and
    the installed onnxruntime has no CUDAExecutionProvider or cannot load it."""
    import onnxruntime as ort

    kind, index = ort_device
    if kind == "cpu":
        return ["CPUExecutionProvider"]
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise InputError(f"{flag} {kind}:{index} needs onnxruntime-gpu: onnxruntime "
                         f"{ort.__version__} here has only {', '.join(available)}; {INSTALL_HINT}")
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:  # CUDA / cuDNN from the nvidia-* wheels (torch's), where installed
        try:
            preload()
        except Exception as exc:  # noqa: BLE001  (a partial preload leaves the system's libraries)
            raise InputError(f"onnxruntime.preload_dlls() failed ({exc}); {INSTALL_HINT}") from None
    return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]


def forward_on_device(runner, input_ids: np.ndarray, past_lengths: np.ndarray, seq_lens: np.ndarray,
                      states):
    """One step of `runner` (an OrtRunner with device_buffers) on OrtValue states; returns
    (logits [B, T|1, V] fp32 numpy, new states as OrtValues)."""
    import onnxruntime as ort

    from gdn_export.onnx.export import LOGITS, TOKEN_INPUTS

    if any(not isinstance(s, ort.OrtValue) for s in states):
        raise InputError("this runner keeps its states on the device: pass the OrtValues that "
                         "empty_states() / forward() returned")
    batch = input_ids.shape[0]
    check_states(runner.run_specs, [(tuple(s.shape()), _ELEM_NAMES.get(s.data_type(), s.data_type()))
                                    for s in states], batch, int(past_lengths[0]))
    kind, index = runner._ort_device
    binding = runner.session.io_binding()
    for name, value in zip(TOKEN_INPUTS, (input_ids, past_lengths, seq_lens)):
        binding.bind_cpu_input(name, np.ascontiguousarray(value, dtype=np.int64))
    binding.bind_output(LOGITS, "cpu")
    in_place = runner.layout.inplace
    new_states = []
    for spec, state in zip(runner.state_specs, states):
        binding.bind_ortvalue_input(spec.name, state)
        if in_place and spec.kind in ("key", "value"):
            binding.bind_ortvalue_output(spec.output_name, state)
            new_states.append(state)
            continue
        if spec.kind in ("key", "value"):  # concat layout: the cache grows, ORT allocates it
            binding.bind_output(spec.output_name, kind, index)
            new_states.append(None)
            continue
        spare = runner._spare.get(spec.name)
        if spare is None or tuple(spare.shape()) != tuple(state.shape()) or spare.data_type() != state.data_type():
            spare = ort.OrtValue.ortvalue_from_shape_and_type(
                state.shape(), np.dtype(_ELEM_NAMES[state.data_type()]).type, kind, index)
        binding.bind_ortvalue_output(spec.output_name, spare)
        runner._spare[spec.name] = state  # the input buffer is the next step's output buffer
        new_states.append(spare)
    with runner.ort_log.capture():
        runner.session.run_with_iobinding(binding)
    outputs = binding.get_outputs()
    new_states = [outputs[1 + i] if s is None else s for i, s in enumerate(new_states)]
    logits = outputs[0].numpy()
    return logits.astype(np.float32, copy=False), new_states
