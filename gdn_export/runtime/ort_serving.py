"""OrtStepRunner: an exported graph in ONNX Runtime (CPU) behind the interface the serving engine
drives (gdn_export.serve.engine: GraphRunner's `step`, `bind_states` and `decode_rows`).

The engine keeps every request's states in rows of torch tensors (a decode pool and staging rows,
model.empty_states(N)). Here those tensors live on the CPU and ONNX Runtime reads them through numpy
views of the same memory: the in-place K/V caches are written straight into the rows (the graph's
TensorScatter, bound to its input's buffer by OrtRunner), the GDN conv and recurrent states it
returns are copied into them. A step over rows 0..n-1 of a set therefore runs on views, as the
GraphRunner's does.

The graph must be one `gdn-export export` wrote with the in-place K/V cache (the default), without a
streaming window, with last-position logits (no --all-logits); bf16 graphs run as fp32 rows holding
bf16 values and FP8 K/V caches as fp32 rows holding e4m3 values (OrtRunner's emulation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gdn_export.errors import InputError
from gdn_export.layout import LOGITS_LAST
from gdn_export.runtime.ort_runner import OrtRunner

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16}


@dataclass(frozen=True)
class RowSpec:
    """One state of the graph as the engine's rows hold it: `name` (past.{i}.{kind}), `shape` with
    "batch" for the rows, torch `dtype`."""

    name: str
    shape: tuple
    dtype: torch.dtype

    def concrete_shape(self, batch: int) -> tuple[int, ...]:
        return tuple(batch if d == "batch" else d for d in self.shape)


class OrtStates:
    """The `model` the engine asks for state rows: state_specs() [RowSpec], empty_states(batch)."""

    def __init__(self, specs: list[RowSpec]):
        self._specs = specs

    def state_specs(self) -> list[RowSpec]:
        return list(self._specs)

    def empty_states(self, batch: int, device=None) -> list[torch.Tensor]:
        """Zero rows [batch, ...] per state, on the CPU (`device` must be the CPU)."""
        if device is not None and torch.device(device).type != "cpu":
            raise InputError(f"the ONNX Runtime rows live on the CPU, not {device}")
        return [torch.zeros(s.concrete_shape(batch), dtype=s.dtype) for s in self._specs]


def check_servable(path, layout) -> None:
    """InputError unless the graph at `path` with DeployLayout `layout` can back the engine."""
    if not layout.inplace or layout.streaming or layout.logits != LOGITS_LAST:
        raise InputError(f"{path}: serving needs a graph exported with the in-place K/V cache, no "
                         f"--attention-window and last-position logits; this one has {layout.describe()}")


def graph_identity(path) -> tuple[str | None, int, object]:
    """(family, vocab size, DeployLayout) from the metadata of the graph at `path` (its weights are not
    read), for the checks before it loads; InputError when the file has none."""
    import onnx
    from google.protobuf.message import DecodeError

    from gdn_export.errors import GdnExportError
    from gdn_export.onnx import metadata

    try:
        props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
        role = props.get(metadata.KEY_SPECULATIVE_ROLE)
        if role is not None:
            raise InputError(f"{path}: the {role} graph of `export --speculative`, which runs inside speculative "
                             f"decoding; serve the model's graph")
        return props.get(metadata.KEY_FAMILY), int(props.get(metadata.KEY_VOCAB, 0)), metadata.read_layout(props)
    except DecodeError as exc:
        raise InputError(f"{path}: not an ONNX model (protobuf could not parse it: {exc})") from None
    except (GdnExportError, KeyError, ValueError) as exc:
        raise InputError(f"{path}: not a gdn-export graph (its metadata: {exc})") from None


class OrtStepRunner:
    """The serving interface over `runner` (an OrtRunner on the CPU provider; module docstring)."""

    backend = "ort"
    cuda_graph = False

    def __init__(self, runner: OrtRunner):
        layout = runner.layout
        if runner.device_buffers:
            raise InputError(f"{runner.path}: serving runs ONNX Runtime on the CPU provider (the engine's "
                             f"rows are CPU tensors), not on {runner.device}")
        check_servable(runner.path, layout)
        self.ort = runner
        self.path = runner.path
        self.layout = layout
        self.device = torch.device("cpu")
        self.vocab_size = runner.vocab_size
        self.kernels_note = runner.kernels_note
        self.model = OrtStates([RowSpec(s.name, s.shape, _TORCH_DTYPES[s.dtype]) for s in runner.run_specs])
        self._pool: list[torch.Tensor] | None = None
        self._sizes: list[int] = []

    def step(self, ids: torch.Tensor, past: torch.Tensor, lens: torch.Tensor,
             states: list[torch.Tensor]) -> torch.Tensor:
        """One graph call: ids [B, T] int64, past [B], lens [B] (CPU tensors), states as
        model.empty_states(B) (row slices of larger sets will do), left updated in place. Returns the
        logits [B, 1, V] fp32 of each row's last real token."""
        views = [t.numpy() for t in states]
        logits, new = self.ort.forward(ids.numpy(), past.numpy(), views, lens.numpy())
        for dst, src in zip(views, new):
            if not np.may_share_memory(dst, src):  # the K/V caches were written in place
                np.copyto(dst, src)
        return torch.from_numpy(logits)

    def bind_states(self, pool: list[torch.Tensor], batch_sizes) -> None:
        """Decode steps run on the first rows of `pool` (tensors as model.empty_states(N)); every size
        is served as it is (no graphs to capture), `batch_sizes` bounds it. The pool is zeroed."""
        sizes = sorted({int(b) for b in batch_sizes})
        rows = int(pool[0].shape[0])
        if not sizes or sizes[0] < 1 or sizes[-1] > rows:
            raise InputError(f"batch sizes {sizes} must lie in [1, {rows}] (the pool's rows)")
        self._pool, self._sizes = list(pool), sizes
        for t in pool:
            t.zero_()

    def decode_rows(self, tokens: torch.Tensor, past: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step of the bound pool's first n rows: tokens [n], past [n] int64. Returns
        (logits [n, 1, V] fp32, the greedy tokens [n] int64)."""
        if self._pool is None:
            raise InputError("decode_rows needs a state pool (bind_states)")
        n = int(tokens.shape[0])
        if n > self._sizes[-1]:
            raise InputError(f"{n} rows exceed the largest bound batch size {self._sizes[-1]}")
        logits = self.step(tokens.reshape(n, 1), past, torch.ones(n, dtype=torch.int64),
                           [t[:n] for t in self._pool])
        return logits, logits[:, -1].argmax(-1)
