"""Small host <-> device transfers that do not wait for the device's queue.

A plain `torch.tensor(values, device="cuda")` copies from pageable memory, which waits until the
device has run everything queued before it; the engine queues a decode step and then prepares the
next one while it runs, so its index and parameter tensors go through pinned memory instead (the
caching host allocator keeps a pinned block until the copy that reads it has run).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


def to_device(values: Sequence, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """values as a 1-D tensor of `dtype` on `device`, copied without a host wait."""
    t = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def to_host(t: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """(a host copy of t on its way, an event recorded after the copy; None on the CPU, where the
    copy is t itself). Read the copy after event.synchronize()."""
    if t.device.type != "cuda":
        return t, None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return host, ready
