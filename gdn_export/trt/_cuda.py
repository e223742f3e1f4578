"""The CUDA side of TrtRunner: device buffers, the runner's own stream, events, host copies.

TrtRunner does every device operation through one of these objects, so that the tests can
replace it with a CPU stand-in (tests/trt/fake_trt.py) and check the call sequence on a machine
without a GPU. `TorchCuda` is the real one: torch CUDA tensors and streams on one device.
"""

from __future__ import annotations

import numpy as np

from gdn_export.errors import GdnExportError, InputError


class TorchCuda:
    """torch CUDA tensors / streams on `device` (None: the current CUDA device; int or "cuda:N")."""

    def __init__(self, device: int | str | None = None):
        import torch

        if not torch.cuda.is_available():
            raise GdnExportError("the TensorRT runner needs a CUDA GPU (torch.cuda.is_available() is False)")
        dev = torch.device(f"cuda:{device}" if isinstance(device, int) else device or "cuda")
        if dev.type != "cuda":
            raise InputError(f"the TensorRT runner runs on a CUDA device, got {device!r}")
        self.device = dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())
        self._torch = torch

    def scope(self):
        """Context in which TensorRT objects are created (the device current)."""
        return self._torch.cuda.device(self.device)

    def zeros(self, numel: int, dtype):
        """A flat zero-filled device buffer of `numel` elements (at least one: a non-null address)."""
        return self._torch.zeros(max(int(numel), 1), dtype=dtype, device=self.device)

    def new_stream(self):
        # A non-default stream: work on the legacy default stream synchronises with every other
        # stream of the device, once per TensorRT call.
        return self._torch.cuda.Stream(self.device)

    def current_stream(self):
        """The caller's stream (torch's current stream on the device)."""
        return self._torch.cuda.current_stream(self.device)

    @staticmethod
    def handle(stream) -> int:
        """The cudaStream_t TensorRT is given."""
        return stream.cuda_stream

    @staticmethod
    def wait(waiter, producer) -> None:
        """Work enqueued on `waiter` from now on waits for what is enqueued on `producer` so far
        (an event recorded on `producer`, waited on by `waiter`; the host does not block)."""
        if waiter is not producer:
            waiter.wait_stream(producer)

    def on(self, stream):
        """Context making `stream` torch's current stream (copies below are enqueued on it)."""
        return self._torch.cuda.stream(stream)

    @staticmethod
    def upload(dst, array: np.ndarray) -> None:
        """Copy host `array` into device view `dst` on the current stream."""
        import torch

        dst.copy_(torch.from_numpy(np.ascontiguousarray(array)))

    @staticmethod
    def to_host(tensor) -> np.ndarray:
        """`tensor` as a host array, after the current stream's work (blocks until then)."""
        import torch

        t = tensor.float() if tensor.dtype == torch.bfloat16 else tensor
        return t.cpu().numpy()
