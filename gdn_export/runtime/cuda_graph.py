"""GraphRunner: the torch runner's fast path on a CUDA GPU.

What makes it fast, against TorchRunner (which is the same model, stepped eagerly):

- States live in static buffers, one set per batch size, allocated once by `empty_states(B)` and
  updated in place by every call; the runner returns those same tensors (only the latest states are
  valid, as with TrtRunner). The K/V caches are written in place by the model, the GDN recurrent
  states by the in-place kernels (gdn_export.ops.gated_delta_rule.gated_delta_rule_; backends
  without one copy back), the conv states by a copy inside the step.
- A decode step (T = 1, a fixed batch) is captured once per batch size as a CUDA graph
  (torch.cuda.CUDAGraph: three warm-up calls on a side stream, then the capture) and replayed: one
  launch per step instead of ~1500 kernels launched from Python. The graph reads the token ids and
  lengths from static device buffers, and it also picks the greedy token on the GPU and advances
  the lengths, so `decode_greedy` replays the graph N times with no host synchronisation and no
  allocation at all; the tokens come back in one copy at the end.
- Sibling projections of one input (q / k / v / z / b / a of a GDN layer, q / k / v of attention,
  gate / up of an MLP) run as one GEMM (gdn_export.modules.fused_linear): at decode a GEMM is a pass
  over its weights, and a few large ones get nearer the copy bandwidth than many small ones.
- The model's own input checks (which read lengths back from the GPU) are off: Runner.forward
  checks ids, lengths and cache room on the host before anything runs.
- A prefill call of equal-length rows is captured too, once its shape (batch, tokens per row) comes
  a second time (the first call runs eagerly and warms every kernel up), and replayed from then on:
  a 4096-token prefill launches ~500-700 kernels from Python, which on an H100 took the host longer
  than the GPU (FP8: 46 ms of host time for 26 ms of kernels). At most MAX_PREFILL_GRAPHS shapes
  stay captured (the least recently used goes); they share one memory pool, which keeps one prefill
  call's activations while any is held (`release_prefill_graphs` frees it;
  GDN_EXPORT_PREFILL_GRAPHS=0 keeps every prefill eager). Ragged rows run eagerly.
- compile=True wraps the model in torch.compile (inductor fuses the small elementwise ops: norms
  with their gates, rotary, the gates of the GDN layer) before the capture; the gdn custom ops stay
  opaque calls into the op backend. Prefill (compiled too with compile=True) runs in calls of at
  most `prefill_chunk` tokens per row, by default sized from the prompt and the free
  memory (`default_prefill_chunk`: 4K..16K tokens a call; gdn_export.runtime.base.prefill).

On the CPU (or cuda_graph=False) it behaves like TorchRunner with static buffers, which is what the
CPU tests check against TorchRunner.
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from gdn_export.errors import GdnExportError, InputError
from gdn_export.modules.fused_linear import fuse_linears
from gdn_export.runtime.base import check_fits, check_lengths
from gdn_export.runtime.torch_runner import TorchRunner

# Tokens of one prefill call over the whole batch when no chunk is given: the runner sizes the call
# itself between these bounds (`default_prefill_chunk`): at least PREFILL_TOKENS (one 4096-token
# prompt in one call), at most MAX_PREFILL_TOKENS, and no more than the activations of
# ACTIVATION_SHARE of the free device memory hold (a batch of long prompts in one call would hold
# every token's activations at once: a 4096-token batch of 32 rows took 4x the memory of weights +
# states). Past ~16K tokens a call gains nothing (each chunk's attention already fills the GPU).
PREFILL_TOKENS = 4096
MAX_PREFILL_TOKENS = 8192
ACTIVATION_SHARE = 0.25
# Live activation values per token of one layer call, in units of the widest projection output
# (GDN in_proj, MLP gate + up, attention q + gate) plus hidden-sized temporaries; x2 for the
# allocator's slack and the kernels' workspaces.
ACTIVATION_FACTOR = 2
WARMUP_CALLS = 3  # before a capture: lazy init (cuBLAS handles, Triton / inductor compiles)
# Prefill shapes (batch, tokens per row) kept as captured graphs, least recently used dropped first.
MAX_PREFILL_GRAPHS = 4
MAX_SEEN_SHAPES = 4096  # shapes remembered as run once (forgotten all at once past this)
PREFILL_GRAPHS_ENV = "GDN_EXPORT_PREFILL_GRAPHS"  # 0: every prefill eager (prefill_graphs_default)
# GraphRunner's compile modes -> torch.compile's (the runner captures its own CUDA graphs)
COMPILE_MODES = {"default": None, "max-autotune": "max-autotune-no-cudagraphs"}


@dataclass
class _Static:
    """One batch size's device buffers (and its captured decode graph, if any).

    ids [B, 1] int64, past [B] int64, lens [B] int64 (ones), states as model.state_specs(),
    logits [B, 1, V] fp32 and next_token [B] int64: the graph's outputs (its private memory).
    """

    ids: torch.Tensor
    past: torch.Tensor
    lens: torch.Tensor
    states: list[torch.Tensor]
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None
    next_token: torch.Tensor | None = None


@dataclass
class _PrefillGraph:
    """One captured prefill shape: ids [B, T] int64, past [B] int64 and lens [B] int64 (all T) are
    its static inputs, logits [B, 1, V] fp32 its output (in the shared prefill pool); it updates the
    batch size's static states (bind_states, which replaces them, drops every prefill graph)."""

    ids: torch.Tensor
    past: torch.Tensor
    lens: torch.Tensor
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None


class GraphRunner(TorchRunner):
    """HybridForCausalLM with static states and CUDA-graph decode (module docstring).

    model: gdn_export.models.hybrid.HybridForCausalLM; device: a CUDA device (CPU works, without
    graphs); op_backend: "reference" / "triton" / "cuda" (default: the active one);
    cuda_graph: capture the decode step (default: on CUDA); compile: torch.compile the model first;
    compile_mode: "default", or "max-autotune" (inductor times its Triton GEMM templates against
    cuBLAS per shape and keeps the faster: minutes of compiling; its own CUDA graphs stay off, this
    runner captures).
    """

    def __init__(self, model, device: str | torch.device = "cuda", op_backend: str | None = None,
                 cuda_graph: bool | None = None, compile: bool = False, compile_mode: str = "default",
                 prefill_graphs: bool | None = None):
        if compile_mode not in COMPILE_MODES:
            raise InputError(f"compile mode must be one of {sorted(COMPILE_MODES)}, got {compile_mode!r}")
        super().__init__(model, device=device, op_backend=op_backend)
        self.model.check_inputs = False  # Runner.forward checks on the host (no device reads)
        # The GDN layers update the static buffers in place (in-place kernels of the triton / cuda
        # backends at T = 1): no copy of the recurrent states per step. The model now belongs to this
        # runner (a TorchRunner on it would see its states change under it).
        from gdn_export.modules.gated_deltanet import GatedDeltaNet

        for module in self.model.modules():
            if isinstance(module, GatedDeltaNet):
                module.update_states_in_place = True
        # Sibling projections of one input as one GEMM each (weights become views of one tensor:
        # no extra memory; gdn_export.modules.fused_linear).
        fuse_linears(self.model)
        self.cuda_graph = self.device.type == "cuda" if cuda_graph is None else bool(cuda_graph)
        if self.cuda_graph and self.device.type != "cuda":
            raise InputError(f"CUDA graphs need a CUDA device, got {self.device}")
        self.compiled = bool(compile)
        self._step_model = (torch.compile(self.model, dynamic=False, mode=COMPILE_MODES[compile_mode])
                            if compile else self.model)
        self._static: dict[int, _Static] = {}
        self._pool: list[torch.Tensor] | None = None  # bind_states: every batch size's rows in one pool
        self.prefill_graphs = (prefill_graphs_default(self.cuda_graph) if prefill_graphs is None
                               else bool(prefill_graphs))
        if self.prefill_graphs and not self.cuda_graph:
            raise InputError("prefill graphs need CUDA graphs (cuda_graph=True on a CUDA device)")
        self._prefill: OrderedDict[tuple[int, int], _PrefillGraph] = OrderedDict()
        self._prefill_seen: set[tuple[int, int]] = set()  # shapes run once eagerly
        self._prefill_failed: set[tuple[int, int]] = set()  # shapes whose capture failed: eager
        self._prefill_mempool = None

    def default_prefill_chunk(self, batch: int, prompt_len: int | None = None) -> int:
        """Tokens per row per prefill call: PREFILL_TOKENS // batch on the CPU; on a GPU the whole
        batch's tokens per call between PREFILL_TOKENS and MAX_PREFILL_TOKENS, as many as
        ACTIVATION_SHARE of the free memory holds (`activation_bytes_per_token`), then divided by
        `batch`. With `prompt_len`, the prompt is cut into equal calls of at most that many tokens
        (a multiple of 64, the GDN chunk), never more than the prompt. At least 1."""
        tokens = PREFILL_TOKENS
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            fit = int(free * ACTIVATION_SHARE) // self.activation_bytes_per_token()
            tokens = max(PREFILL_TOKENS, min(MAX_PREFILL_TOKENS, fit))
        chunk = max(1, tokens // max(batch, 1))
        if prompt_len:
            calls = -(-int(prompt_len) // chunk)
            even = -(-int(prompt_len) // calls)
            chunk = min(chunk, -(-even // 64) * 64, int(prompt_len))
        return chunk

    def activation_bytes_per_token(self) -> int:
        """Bytes a prefill call holds per token beyond weights and states: ACTIVATION_FACTOR x the
        widest projection output + 8 hidden-sized values, in the model's dtype."""
        widest = max((m.out_features for m in self.model.modules() if isinstance(m, torch.nn.Linear)
                      and m.out_features != self.model.config.vocab_size), default=0)
        hidden = self.model.config.hidden_size
        return ACTIVATION_FACTOR * self.model.dtype.itemsize * (widest + 8 * hidden)

    # ------------------------------------------------------------------ states
    def empty_states(self, batch: int) -> list[torch.Tensor]:
        """The static state buffers of `batch` rows, zeroed (capturing the decode graph of this
        batch size first, on the zeroed buffers). States returned earlier for this batch size are
        the same tensors: they are reset too."""
        st = self._static_for(batch)
        for t in st.states:
            t.zero_()
        return st.states

    def _static_for(self, batch: int) -> _Static:
        st = self._static.get(batch)
        if st is None:
            if self._pool is not None:  # a capture now would step rows that hold sequences
                raise InputError(f"batch size {batch} is not one of the sizes bound to the state pool "
                                 f"({sorted(self._static)})")
            st = self._new_static(batch, list(self.model.empty_states(batch, device=self.device)))
        return st

    def _new_static(self, batch: int, states: list[torch.Tensor]) -> _Static:
        dev = self.device
        st = _Static(ids=torch.zeros(batch, 1, dtype=torch.int64, device=dev),
                     past=torch.zeros(batch, dtype=torch.int64, device=dev),
                     lens=torch.ones(batch, dtype=torch.int64, device=dev), states=states)
        self._static[batch] = st
        if self.cuda_graph:
            self._capture(st)
        return st

    # ------------------------------------------------------------------ a pool of state rows
    def bind_states(self, pool: list[torch.Tensor], batch_sizes) -> None:
        """Serve the decode steps of a changing set of sequences from one pool of state rows
        (gdn_export.serve): the static buffers of each batch size b in `batch_sizes` become the
        first b rows of `pool` (tensors shaped as model.empty_states(N), b <= N), and their decode
        graphs are captured now, since the capture's warm-up steps write into those rows. Bind
        before the rows hold anything; the pool is zeroed after. Earlier buffers are dropped."""
        sizes = sorted({int(b) for b in batch_sizes})
        rows = int(pool[0].shape[0])
        if not sizes or sizes[0] < 1 or sizes[-1] > rows:
            raise InputError(f"batch sizes {sizes} must lie in [1, {rows}] (the pool's rows)")
        self._static, self._pool = {}, None
        self.release_prefill_graphs()  # captured on the dropped buffers
        for b in sizes:
            self._new_static(b, [t[:b] for t in pool])
        self._pool = list(pool)
        for t in pool:
            t.zero_()

    def decode_rows(self, tokens: torch.Tensor, past: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step of the bound pool's first n rows: tokens [n] and past [n] int64 on this
        runner's device (each row's next input and its position). Runs at the smallest bound batch
        size >= n (a replayed graph on CUDA); rows n.. of that batch are free rows, stepped at
        position 0 and ignored. Unchecked: callers keep past below the cache length. Returns
        (logits [n, 1, V] fp32, the greedy tokens [n] int64), device views valid until the next
        call."""
        if self._pool is None:
            raise InputError("decode_rows needs a state pool (bind_states)")
        n = int(tokens.shape[0])
        size = next((b for b in self._static if b >= n), None)  # dict order: ascending sizes
        if size is None:
            raise InputError(f"{n} rows exceed the largest bound batch size {max(self._static)}")
        st = self._static[size]
        st.ids[:n, 0].copy_(tokens)
        st.past[:n].copy_(past)
        if size > n:
            st.ids[n:].zero_()
            st.past[n:].zero_()
        logits, token = self._replay(st)
        return logits[:n], token[:n]

    def _step_on(self, st: _Static, ids: torch.Tensor, past: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """One model call on st's states (device tensors ids [B, T], past [B], lens [B]), the new states
        left in st's buffers; returns the logits."""
        logits, new_states = self._call(ids, past, lens, st.states, model=self._step_model)
        self._load(st, new_states)
        return logits

    def _load(self, st: _Static, states: list[torch.Tensor]) -> None:
        """Copy `states` into the static buffers where they are other tensors (a caller's own
        states, or those an eager prefill returned)."""
        for buf, t in zip(st.states, states):
            if t.data_ptr() != buf.data_ptr():
                buf.copy_(t)

    # ------------------------------------------------------------------ the decode step
    def _decode_step(self, st: _Static) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode call on the static buffers: states updated in place, the greedy token written
        to st.ids, lengths advanced by one. Returns (logits [B, 1, V] fp32, next token [B])."""
        logits = self._step_on(st, st.ids, st.past, st.lens)
        token = logits[:, -1].argmax(-1)
        st.ids.copy_(token[:, None])
        st.past.add_(1)
        return logits, token

    def _capture(self, st: _Static) -> None:
        """Capture `_decode_step` of st's batch size as a CUDA graph (side-stream warm-up first).
        The warm-up and the capture run on the static buffers, which empty_states zeroes after."""
        def step():
            st.logits, st.next_token = self._decode_step(st)

        st.graph = capture_graph(step, self.device, f"the decode step (op backend {self.op_backend or 'default'})",
                                 "--no-cuda-graph")

    def _replay(self, st: _Static) -> tuple[torch.Tensor, torch.Tensor]:
        if st.graph is None:
            return self._decode_step(st)
        st.graph.replay()
        return st.logits, st.next_token

    # ------------------------------------------------------------------ prefill graphs
    def release_prefill_graphs(self) -> None:
        """Drop the captured prefill graphs and their memory pool (captured again as shapes repeat)."""
        self._prefill.clear()
        self._prefill_seen.clear()
        self._prefill_mempool = None

    def _prefill_call(self, st: _Static, ids: torch.Tensor, past: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """One prefill call of rows that all take ids.shape[1] tokens (lens all T) on st's states:
        ids [B, T] int64, past [B] int64 on the device. Eager the first time a shape comes, a captured
        graph's replay after (prefill_graphs on). Returns logits [B, 1, V] fp32, a tensor of its own."""
        key = (int(ids.shape[0]), int(ids.shape[1]))
        g = self._prefill.get(key) if self.prefill_graphs else None
        if (g is None and self.prefill_graphs and key in self._prefill_seen and key not in self._prefill_failed):
            g = self._capture_prefill(st, key)
        if g is None:
            if self.prefill_graphs:
                if len(self._prefill_seen) >= MAX_SEEN_SHAPES:  # a server's many prompt lengths
                    self._prefill_seen.clear()
                self._prefill_seen.add(key)
            return self._step_on(st, ids, past, lens)
        self._prefill.move_to_end(key)
        g.ids.copy_(ids)
        g.past.copy_(past)
        g.graph.replay()
        return g.logits.clone()  # the pool is rewritten by the next prefill replay of any shape

    def _capture_prefill(self, st: _Static, key: tuple[int, int]) -> _PrefillGraph | None:
        """Capture the prefill of `key` = (batch, tokens) on st's states, or None (a warning) when the
        capture fails: that shape then stays eager. No warm-up calls: the shape's eager call did the
        lazy initialisation, and a warm-up would step the caller's states."""
        B, T = key
        dev = self.device
        g = _PrefillGraph(ids=torch.zeros(B, T, dtype=torch.int64, device=dev),
                          past=torch.zeros(B, dtype=torch.int64, device=dev),
                          lens=torch.full((B,), T, dtype=torch.int64, device=dev))

        def call():
            g.logits = self._step_on(st, g.ids, g.past, g.lens)

        if self._prefill_mempool is None:
            self._prefill_mempool = torch.cuda.graph_pool_handle()
        try:
            g.graph = capture_graph(call, dev, f"the prefill of {B} x {T} tokens", "--no-cuda-graph",
                                    warmup=0, pool=self._prefill_mempool)
        except GdnExportError as exc:
            self._prefill_failed.add(key)
            warnings.warn(f"{exc}; prefills of this shape run eagerly", RuntimeWarning, stacklevel=3)
            return None
        self._prefill[key] = g
        while len(self._prefill) > MAX_PREFILL_GRAPHS:
            self._prefill.popitem(last=False)
        return g

    # ------------------------------------------------------------------ Runner
    def _forward(self, input_ids: np.ndarray, past_lengths: np.ndarray, seq_lens: np.ndarray, states):
        batch, seq = input_ids.shape
        states = self._check_state_tensors(states, batch, int(past_lengths[0]))
        st = self._static_for(batch)
        self._load(st, states)
        if seq == 1 and bool((seq_lens == 1).all()):
            st.ids.copy_(torch.from_numpy(input_ids))
            st.past.copy_(torch.from_numpy(past_lengths))
            logits, _ = self._replay(st)
            return logits.float().cpu().numpy(), st.states
        ids = torch.from_numpy(input_ids).to(self.device)
        past = torch.from_numpy(past_lengths).to(self.device)
        lens = torch.from_numpy(seq_lens).to(self.device)
        if bool((seq_lens == seq).all()):
            logits = self._prefill_call(st, ids, past, lens)
        else:
            logits = self._step_on(st, ids, past, lens)
        return logits.float().cpu().numpy(), st.states

    def prefill_device(self, ids: torch.Tensor, states, chunk: int | None = None):
        """Prefill rows of equal length from device tensors, without host round trips: ids [B, T]
        int64 on this runner's device, states from `empty_states(B)`; calls of at most `chunk`
        tokens (default: `default_prefill_chunk(B)`). Returns (logits [B, 1, V] fp32 on the device,
        the static states). For ragged rows and host arrays use gdn_export.runtime.base.prefill."""
        batch, seq = ids.shape
        if self.layout.streaming:
            raise InputError("prefill_device does not split calls at the streaming ring's end; use "
                             "gdn_export.runtime.base.prefill")
        check_fits(self.layout, np.zeros(batch, np.int64), np.full(batch, seq, np.int64), seq)
        st = self._static_for(batch)
        self._load(st, self._check_state_tensors(states, batch, 0))
        chunk = self.default_prefill_chunk(batch, seq) if chunk is None else int(chunk)
        if chunk < 1:
            raise InputError(f"prefill chunk must be >= 1, got {chunk}")
        logits = None
        for start in range(0, seq, chunk):
            size = min(chunk, seq - start)
            past = torch.full((batch,), start, dtype=torch.int64, device=self.device)
            lens = torch.full((batch,), size, dtype=torch.int64, device=self.device)
            logits = self._prefill_call(st, ids[:, start:start + size], past, lens)
        return logits, st.states

    def decode_greedy(self, tokens, past_lengths, states, steps: int,
                      keep_logits: bool = False) -> tuple[torch.Tensor, list[torch.Tensor], list]:
        """`steps` greedy decode calls without a host sync: tokens [B, 1] (the next input of each
        row, host or device), past_lengths [B] host ints, states from this runner.

        Returns (picked [B, steps] int64 on the device: the token each call picked, states, logits:
        one [B, 1, V] fp32 device tensor per call when keep_logits (copies), else []).
        """
        tokens = torch.as_tensor(np.asarray(tokens) if not isinstance(tokens, torch.Tensor) else tokens)
        batch = tokens.shape[0]
        if tokens.shape != (batch, 1):
            raise InputError(f"tokens must be [batch, 1], got {tuple(tokens.shape)}")
        past = check_lengths(past_lengths, batch, "past_lengths", 0, None)
        if steps < 1:
            raise InputError(f"steps must be >= 1, got {steps}")
        # The last call runs at past + steps - 1 (rows advance together, one token each).
        if not self.layout.streaming:
            check_fits(self.layout, past + (steps - 1), np.ones(batch, np.int64), 1)
        states = self._check_state_tensors(states, batch, int(past[0]))
        st = self._static_for(batch)
        self._load(st, states)
        st.ids.copy_(tokens.to(self.device, torch.int64))
        st.past.copy_(torch.from_numpy(past))
        picked = torch.empty(batch, steps, dtype=torch.int64, device=self.device)
        kept = []
        for i in range(steps):
            logits, token = self._replay(st)
            picked[:, i].copy_(token)
            if keep_logits:
                kept.append(logits.clone())
        return picked, st.states, kept


def prefill_graphs_default(cuda_graph: bool) -> bool:
    """Prefill graphs follow CUDA graphs unless GDN_EXPORT_PREFILL_GRAPHS=0 (every prefill eager,
    no pool held between calls); other values than 0 / 1: InputError."""
    value = os.environ.get(PREFILL_GRAPHS_ENV, "1").strip()
    if value not in ("0", "1"):
        raise InputError(f"{PREFILL_GRAPHS_ENV} must be 0 or 1, got {value!r}")
    return cuda_graph and value == "1"


def capture_graph(fn, device: torch.device, what: str, instead: str, warmup: int = WARMUP_CALLS, pool=None):
    """fn() captured as a torch.cuda.CUDAGraph after `warmup` calls on a side stream (lazy
    initialisation, Triton compiles), in memory pool `pool` (torch.cuda.graph_pool_handle(); None:
    a private one); GdnExportError naming `what` and the flag that runs without graphs (`instead`)
    when an op cannot be captured (a host sync or a host-side allocation)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, pool=pool):
            fn()
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GdnExportError(f"capturing {what} as a CUDA graph failed: {first}; run without CUDA graphs "
                             f"({instead})") from exc
    return graph
