"""One translation registry per process: torch.onnx builds onnxscript's torchlib registry anew for
every export (`ONNXRegistry.from_torchlib`: ~500 translations, 0.4-0.7 s on a 2-core CPU), then
registers the export's custom translations into it. `reuse_torchlib_registry()` builds it once per
opset and hands each export a copy of its own (the table copied, the translations shared), so the
custom translations of one export never reach another. A torch whose exporter lacks the hook builds
it as usual.
"""

from __future__ import annotations

import contextlib
import threading

_LOCK = threading.Lock()
_BUILT: dict[tuple, object] = {}


def _copy(registry):
    fresh = type(registry)()
    fresh.__dict__.update(registry.__dict__)
    fresh.functions = {target: list(metas) for target, metas in registry.functions.items()}
    return fresh


@contextlib.contextmanager
def reuse_torchlib_registry():
    """Within: `ONNXRegistry.from_torchlib(opset_version)` returns a copy of the registry this process
    built for that opset (building it on first use). Exports in other threads wait."""
    try:
        from torch.onnx._internal.exporter import _registration
        original = _registration.ONNXRegistry.__dict__["from_torchlib"]
        build = original.__func__
    except (ImportError, AttributeError, KeyError):
        yield
        return

    def from_torchlib(cls, *args, **kwargs):
        key = (cls, args, tuple(sorted(kwargs.items())))
        if key not in _BUILT:
            _BUILT[key] = build(cls, *args, **kwargs)
        return _copy(_BUILT[key])

    with _LOCK:
        _registration.ONNXRegistry.from_torchlib = classmethod(from_torchlib)
        try:
            yield
        finally:
            _registration.ONNXRegistry.from_torchlib = original
