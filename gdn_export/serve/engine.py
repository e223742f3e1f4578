"""The engine: continuous batching of many requests over one GraphRunner, in its own thread.

States. Two sets of state rows, allocated once (model.empty_states): the decode pool of
max_num_seqs rows, bound to the runner (GraphRunner.bind_states: its decode step, a CUDA graph per
batch size on a GPU, runs on the pool's first rows), and the staging rows where max_prefill_seqs
sequences are prefilled. Each row holds one sequence's conv state, recurrent state and K/V cache
of `cache_len` slots; the rows are kept compact by the scheduler (gdn_export.serve.scheduler), so
every model call runs on the first n rows of a set, as views.

One iteration of the loop:
  1. cancelled requests leave (their rows are reused at once), waiting ones are admitted into
     zeroed staging rows;
  2. one prefill call on the staging rows (runner.step: ragged rows, chunks of at most
     prefill_tokens together); a sequence whose prompt is done picks its first token from that call's
     logits, and its state rows are copied into the next free pool row;
  3. one decode step is launched on the pool's rows (runner.decode_rows, then the token picks, all on
     the device), each row at its own position, its input the token the step before picked (gathered
     on the device) or a promoted row's first token;
  4. the outputs of the step launched one iteration earlier come back to the host (by then the
     device runs the new one): every new token goes out in one `deliver` call, and finished sequences
     leave. A sequence that finished in that step has taken part in the new one too; its extra token is
     dropped (the cache has room for it: the prompt plus max_tokens fits).
Step 4 after step 3 keeps the device busy while the host hands out tokens and schedules. On the CPU
the same code runs, each step done by the time it is launched.

A decode row's tokens are the tokens the same prompt gets alone: rows never mix (each row's
attention reads its own cache under its own mask, its GDN state is its own, padded and free rows are
inert or ignored). A failing model call fails the requests it held (EngineFailure), never the
engine. Requests come in through `submit` and `cancel` from any thread.

With `speculation` (gdn_export.serve.speculation: the MTP head's drafts), each row also holds the
head's cache and catch-up inputs, prefill chunks feed the head too, and step 3 is one speculative
round over the pool's rows, read back at once (1 .. K + 1 tokens a row) instead of a pipelined
decode step.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from gdn_export.errors import InputError
from gdn_export.runtime.base import check_fits
from gdn_export.serve.errors import EngineFailure, ServeError, Unavailable
from gdn_export.serve.sampling import SamplingParams, pick_tokens
from gdn_export.serve.scheduler import DONE, Limits, Moves, Scheduler, Sequence
from gdn_export.serve.transfer import to_device, to_host

log = logging.getLogger("gdn_export.serve")


@dataclass(frozen=True)
class Output:
    """What one request got from one iteration. token_ids: its new tokens (empty with an error or
    a cancel); finish_reason: None while running, then "stop" (an end-of-sequence or stop id),
    "length" (max_tokens) or "cancelled"; stop_token: the last token is the one that stopped it
    (counted, no text); error: why the request failed; prompt_tokens / generated: its counts."""

    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    stop_token: bool = False
    error: ServeError | None = None
    prompt_tokens: int = 0
    generated: int = 0


class _NoMetrics:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def pool_batch_sizes(rows: int, cuda_graph: bool) -> list[int]:
    """Batch sizes the decode step is prepared for: every size without CUDA graphs; with them
    powers of two and `rows` (a graph each; fewer rows run at the next size up)."""
    if not cuda_graph:
        return list(range(1, rows + 1))
    sizes = {rows}
    b = 1
    while b < rows:
        sizes.add(b)
        b *= 2
    return sorted(sizes)


class Engine:
    """Continuous batching over `runner` (a gdn_export.runtime.cuda_graph.GraphRunner whose layout
    has an in-place, non-streaming cache) within `limits`. eos_ids: tokens that end a generation
    (unless a request ignores them). `deliver(items)` receives [(sink, Output), ...] once per
    iteration, from the engine thread; set it before `start()`. metrics: a ServeMetrics or None.
    speculation: a gdn_export.serve.speculation.Speculation over the same runner (decode by
    speculative rounds; module docstring), or None."""

    def __init__(self, runner, limits: Limits = Limits(), eos_ids=(), metrics=None, seed: int | None = None,
                 deliver: Callable[[list[tuple[Any, Output]]], None] | None = None, speculation=None):
        layout = runner.layout
        if not layout.inplace or layout.streaming:
            raise InputError(f"serving needs an in-place, non-streaming K/V cache; the model has {layout.describe()}")
        if getattr(runner, "bind_states", None) is None:
            raise InputError(f"serving needs the GraphRunner (gdn_export.runtime.cuda_graph), got "
                             f"{type(runner).__name__}")
        self.runner = runner
        self.device = runner.device
        # the tokens a request may use (prompt + max_tokens): the cache but the slots a speculative
        # round writes past a request's last token
        extra = speculation.cache_slots if speculation is not None else 0
        self.cache_len = layout.cache_len - extra
        if self.cache_len < 1:
            raise InputError(f"a cache of {layout.cache_len} slots leaves no room beside the {extra} a "
                             f"speculative round needs")
        self.vocab_size = runner.vocab_size
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self.spec = speculation
        if speculation is not None and speculation.runner is not runner:
            raise InputError("the speculation was made for another runner")
        self.sched = Scheduler(limits, self.cache_len)
        self.metrics = metrics or _NoMetrics()
        self.deliver = deliver
        model = runner.model
        # each row set: the model's states, then (speculation) the head's cache and catch-up inputs
        self.pool = list(model.empty_states(limits.max_num_seqs, device=self.device))
        self.staging = list(model.empty_states(limits.max_prefill_seqs, device=self.device))
        self.n_model = len(self.pool)
        if speculation is not None:
            self.pool += speculation.extra_states(limits.max_num_seqs)
            self.staging += speculation.extra_states(limits.max_prefill_seqs)
            # rounds at power-of-two batch sizes (a CUDA graph each on a GPU), on every device alike
            speculation.bind(self.pool[:self.n_model], self.pool[self.n_model:],
                             pool_batch_sizes(limits.max_num_seqs, True))
        else:
            runner.bind_states(self.pool, pool_batch_sizes(limits.max_num_seqs, runner.cuda_graph))
        seed = int.from_bytes(os.urandom(8), "little") >> 1 if seed is None else seed
        self._shared = torch.Generator(device=self.device).manual_seed(seed)
        self._cond = threading.Condition()
        self._cancels: list[Sequence] = []
        self._next_id = 0
        self._stop = False
        self._abort: str | None = None
        self._inflight: _Step | None = None  # the decode step launched last, not yet read back
        self.draining = False
        self.dead: str | None = None  # why the engine thread ended, if it did
        self._thread = threading.Thread(target=self._run, name="gdn-serve-engine", daemon=True)

    def warm_up(self) -> int:
        """Run the prefill once at each shape class the scheduler produces, before any request: Triton
        compiles a kernel for each specialization of its integer arguments (1, a multiple of 16,
        other), so the first ragged prefill of several rows would otherwise stall its requests for a
        compile (1.4 s to the first token of 8 concurrent 512-token prompts on an H100). Row counts 1,
        2 and max_prefill_seqs; a first chunk of the scheduler's width and a continuation chunk one
        token narrower; rows of ragged lengths. The staging rows are left zeroed. Returns the calls
        made; call it before start()."""
        limits, dev = self.sched.limits, self.device
        calls = 0
        with torch.no_grad():
            for m in sorted({1, min(2, limits.max_prefill_seqs), limits.max_prefill_seqs}):
                width = max(1, min(limits.prefill_tokens // m, self.cache_len // 2))
                for past, w in ((0, width), (width, max(1, width - 1))):
                    if past + w > self.cache_len:
                        continue
                    lens = np.array([max(1, w - i) for i in range(m)], np.int64)
                    args = (torch.zeros((m, w), dtype=torch.int64, device=dev),
                            torch.full((m,), past, dtype=torch.int64, device=dev), torch.from_numpy(lens).to(dev))
                    states = [t[:m] for t in self.staging[:self.n_model]]
                    if self.spec is not None:
                        self.spec.prefill(*args, states, self.staging[self.n_model:])
                    else:
                        self.runner.step(*args, states)
                    calls += 1
            for t in self.staging:
                _bits(t).zero_()
            _sync(dev)
        return calls

    # ------------------------------------------------------------------ any thread
    def start(self) -> None:
        if self.deliver is None:
            raise RuntimeError("Engine.deliver must be set before start()")
        self._thread.start()

    def submit(self, prompt, params: SamplingParams, sink: Any) -> Sequence:
        """Queue a request: prompt token ids (1-D), its SamplingParams; `sink` comes back with each of
        its outputs. BadRequest (ids out of range, too long for the cache), QueueFull, Unavailable
        (draining or stopped) before anything is queued."""
        from gdn_export.serve.errors import BadRequest

        try:
            ids = np.asarray(prompt, dtype=np.int64).reshape(-1)
        except (OverflowError, ValueError, TypeError):
            raise BadRequest("token ids must be integers in [0, vocabulary size)", param="prompt") from None
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
            raise BadRequest(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})", param="prompt")
        self.sched.check_fits(len(ids), params.max_tokens)
        with self._cond:
            self._check_open()
            seq = Sequence(self._next_id, ids, params, sink)
            self.sched.enqueue(seq)
            self._next_id += 1
            self._cond.notify()
        return seq

    def cancel(self, seq: Sequence) -> None:
        """Stop `seq` (a client went away, a stop string matched): its row is freed at the next
        iteration and a last Output says finish_reason "cancelled". No-op once it finished."""
        with self._cond:
            if seq.phase != DONE and not seq.cancelled:
                seq.cancelled = True
                self._cancels.append(seq)
                self._cond.notify()

    def begin_drain(self) -> None:
        """Refuse new requests (Unavailable); the queued and running ones go on."""
        with self._cond:
            self.draining = True

    def abort_all(self, message: str) -> None:
        """Fail every queued and running request with Unavailable(message) at the next iteration."""
        with self._cond:
            self._abort = message
            self._cond.notify()

    def stop(self, timeout: float | None = 10.0) -> None:
        """End the engine thread; requests still queued or running get Unavailable."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def idle(self) -> bool:
        with self._cond:
            return not self.sched.busy

    def stats(self) -> dict:
        with self._cond:
            s = self.sched
            return {"waiting": len(s.waiting), "prefill": len(s.prefilling), "decode": len(s.decoding),
                    "reserved_tokens": s.reserved}

    def _check_open(self) -> None:
        if self.dead is not None:
            raise Unavailable(f"the engine stopped: {self.dead}")
        if self.draining or self._stop:
            raise Unavailable("the server is shutting down and takes no new requests", code="draining")

    # ------------------------------------------------------------------ the engine thread
    def _run(self) -> None:
        if self.device.type == "cuda" and self.device.index is not None:  # "cuda": the current device
            torch.cuda.set_device(self.device)
        try:
            with torch.no_grad():
                while True:
                    try:
                        if not self._iteration():
                            break
                    except Exception as exc:  # outside a model call: fail the running requests, go on
                        log.error("engine iteration failed:\n%s", traceback.format_exc())
                        self._fail_running(f"the engine failed: {type(exc).__name__}: {_first_line(exc)}")
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: the thread ends
            self.dead = f"{type(exc).__name__}: {exc}"
            log.error("engine thread failed:\n%s", traceback.format_exc())
        finally:
            with self._cond:
                everyone = list(self.sched.waiting) + self.sched.prefilling + self.sched.decoding
                self.sched.remove(everyone)
            reason = self.dead or "the server stopped"
            self._send([(s, Output(error=Unavailable(f"the engine stopped: {reason}"))) for s in everyone])

    def _iteration(self) -> bool:
        """One loop iteration (module docstring); False when the engine is to stop."""
        out: list[tuple[Sequence, Output]] = []
        with self._cond:
            while not (self._stop or self._abort or self._cancels or self.sched.busy or self._inflight):
                self._cond.wait()
            if self._stop:
                return False
            if self._abort is not None:  # every row empties: no copies to make
                gone = list(self.sched.waiting) + self.sched.prefilling + self.sched.decoding
                self.sched.remove(gone)
                out += [(s, Output(error=Unavailable(self._abort, code="draining"))) for s in gone]
                self._abort = None
            cancels, self._cancels = [s for s in self._cancels if s.phase != DONE], []
            moves = self.sched.remove(cancels)
            admitted = self.sched.admit()
        self._apply(moves)
        for s in cancels:
            self.metrics.on_finish("cancelled", None)
            out.append((s, Output(finish_reason="cancelled", prompt_tokens=len(s.prompt), generated=len(s.generated))))
        fresh = []
        for s in admitted:
            if s.phase == DONE:  # cancelled while it waited
                self.metrics.on_finish("cancelled", None)
                out.append((s, Output(finish_reason="cancelled", prompt_tokens=len(s.prompt))))
                continue
            fresh.append(s.row)
            if s.params.seed is not None:
                s.generator = torch.Generator(device=self.device).manual_seed(s.params.seed)
        if fresh:  # a prefill starts from zero conv and recurrent states (the K/V are masked by position)
            index = to_device(fresh, self.device)
            for t in self.staging:
                _bits(t).index_fill_(0, index, 0)
        if self.sched.prefilling:
            self._guarded("prefill", self._prefill_step, out)
        if self.sched.decoding or self._inflight:
            self._guarded("decode", self._decode_step, out)
        self._send(out)
        return True

    def _guarded(self, kind: str, step: Callable[[list], None], out: list) -> None:
        """Run one step; if it raises, fail the requests of its rows and free them."""
        try:
            step(out)
        except Exception as exc:
            log.error("%s step failed:\n%s", kind, traceback.format_exc())
            with self._cond:
                rows = list(self.sched.prefilling if kind == "prefill" else self.sched.decoding)
                self.sched.remove(rows)
            if kind == "decode":
                self._inflight = None
            out += self._failed(rows, f"the {kind} step failed: {type(exc).__name__}: {_first_line(exc)}")

    def _failed(self, rows: list[Sequence], message: str) -> list[tuple[Sequence, Output]]:
        error = EngineFailure(message, code="engine_error")
        for _ in rows:
            self.metrics.on_finish("error", None)
        return [(s, Output(error=error, prompt_tokens=len(s.prompt), generated=len(s.generated))) for s in rows]

    def _fail_running(self, message: str) -> None:
        """Fail every prefilling and decoding request (their rows may hold anything now); the queue
        stays."""
        with self._cond:
            rows = self.sched.prefilling + self.sched.decoding
            self.sched.remove(rows)
        self._inflight = None
        self._send(self._failed(rows, message))

    def _prefill_step(self, out: list) -> None:
        with self._cond:
            plan = self.sched.prefill_plan()
            rows = list(self.sched.prefilling)
        m, width = len(rows), plan.width
        ids = np.zeros((m, width), np.int64)
        for i, (s, n) in enumerate(zip(rows, plan.chunks)):
            ids[i, :n] = s.prompt[s.prefilled:s.prefilled + n]
        past = np.array([s.prefilled for s in rows], np.int64)
        lens = np.array(plan.chunks, np.int64)
        check_fits(self.runner.layout, past, lens, width)
        t0 = time.perf_counter()
        dev = self.device
        args = (torch.from_numpy(ids).to(dev), torch.from_numpy(past).to(dev), torch.from_numpy(lens).to(dev))
        states = [t[:m] for t in self.staging[:self.n_model]]
        if self.spec is not None:
            logits = self.spec.prefill(*args, states, self.staging[self.n_model:])[:, None]
        else:
            logits = self.runner.step(*args, states)
        for s, n in zip(rows, plan.chunks):
            s.prefilled += n
        ready = [i for i, s in enumerate(rows) if s.prefilled == len(s.prompt)]
        tokens = []
        if ready:
            index = to_device(ready, dev)
            tokens = pick_tokens(logits[:, -1].index_select(0, index), [rows[i].params for i in ready],
                                 [rows[i].generator for i in ready], self._shared).tolist()
            if self.spec is not None:
                self.spec.first_tokens(self.staging[self.n_model:], ready, tokens)
        else:
            _sync(dev)
        now = time.perf_counter()
        self.metrics.on_step("prefill", now - t0, int(lens.sum()))
        finished = [rows[i] for i, t in zip(ready, tokens) if self._emit(rows[i], t, now, out)]
        with self._cond:
            moves = [self.sched.promote([rows[i] for i in ready if rows[i] not in finished]),
                     self.sched.remove(finished, now)]
        for m_ in moves:
            self._apply(m_)
        if tokens:
            self.metrics.on_tokens(len(tokens), now)

    def _decode_step(self, out: list) -> None:
        """Launch a decode step over the pool's rows (if any), then take back the step launched
        before it (module docstring, steps 3 and 4); with speculation, one round, taken back at once."""
        if self.spec is not None:
            self._spec_round(out)
            return
        before, self._inflight = self._inflight, None
        with self._cond:
            rows = list(self.sched.decoding)
        if rows:
            self._inflight = self._launch(rows, before)
        if before is not None:
            self._collect(before, out)

    def _spec_round(self, out: list) -> None:
        with self._cond:
            rows = list(self.sched.decoding)
        if not rows:
            return
        t0 = time.perf_counter()
        new = self.spec.round(rows, self._shared)
        now = time.perf_counter()
        self.metrics.on_step("decode", now - t0, len(rows))
        self.metrics.on_round(self.spec.k * len(rows), sum(len(t) - 1 for t in new))
        finished, emitted = [], 0
        for s, tokens in zip(rows, new):
            s.launched += len(tokens)
            for token in tokens.tolist():
                emitted += 1
                if self._emit(s, token, now, out):
                    finished.append(s)
                    break
        self.metrics.on_tokens(emitted, now)
        if finished:
            with self._cond:
                moves = self.sched.remove(finished, now)
            self._apply(moves)

    def _launch(self, rows: list[Sequence], before: "_Step | None") -> "_Step":
        dev = self.device
        # Inputs: the token the previous step picked for the row (on the device, not read back yet),
        # or, for a row new to the pool, its first token (from the prefill, on the host).
        at = {id(s): j for j, s in enumerate(before.rows)} if before is not None else {}
        carried = [at.get(id(s), -1) for s in rows]
        fresh = [s.generated[-1] for s, j in zip(rows, carried) if j < 0]
        source = to_device(fresh, dev)
        if before is not None:
            source = torch.cat([before.tokens, source])
        new_row = itertools.count(len(before.rows) if before is not None else 0)  # fresh ones follow in source
        order = [j if j >= 0 else next(new_row) for j in carried]
        tokens = source.index_select(0, to_device(order, dev))
        past = to_device([s.next_position for s in rows], dev)
        t0 = time.perf_counter()
        logits, greedy = self.runner.decode_rows(tokens, past)
        picked = pick_tokens(logits[:, -1], [s.params for s in rows], [s.generator for s in rows],
                             self._shared, greedy)
        for s in rows:
            s.launched += 1
        return _Step(rows, picked, to_host(picked), t0)

    def _collect(self, step: "_Step", out: list) -> None:
        tokens = step.host_tokens()
        now = time.perf_counter()
        self.metrics.on_step("decode", now - step.launched_at, len(step.rows))
        live = [(s, t) for s, t in zip(step.rows, tokens) if s.phase != DONE]  # not finished or cancelled since
        self.metrics.on_tokens(len(live), now)
        finished = [s for s, t in live if self._emit(s, t, now, out)]
        if finished:
            with self._cond:
                moves = self.sched.remove(finished, now)
            self._apply(moves)

    def _emit(self, s: Sequence, token: int, now: float, out: list) -> bool:
        """Record `token` as s's next; True when that finishes s."""
        s.generated.append(token)
        if s.first_token_at is None:
            s.first_token_at = now
            self.metrics.on_first_token(now - s.arrival)
        else:
            self.metrics.on_next_token(now - s.last_token_at)
        s.last_token_at = now
        p = s.params
        stop = token in p.stop_token_ids or (token in self.eos_ids and not p.ignore_eos)
        reason = "stop" if stop else "length" if len(s.generated) >= p.max_tokens else None
        out.append((s, Output((token,), reason, stop, prompt_tokens=len(s.prompt), generated=len(s.generated))))
        if reason is not None:
            self.metrics.on_finish(reason, now - s.arrival)
        return reason is not None

    def _apply(self, moves: Moves) -> None:
        """Make the row copies the scheduler asked for (whole rows: conv, recurrent, K/V)."""
        for pairs, dst, src in ((moves.promote, self.pool, self.staging), (moves.staging, self.staging, self.staging),
                                (moves.pool, self.pool, self.pool)):
            if not pairs:
                continue
            s_idx = to_device([p[0] for p in pairs], self.device)
            d_idx = to_device([p[1] for p in pairs], self.device)
            for d, s in zip(dst, src):
                _bits(d).index_copy_(0, d_idx, _bits(s).index_select(0, s_idx))

    def _send(self, out: list[tuple[Sequence, Output]]) -> None:
        if not out:
            return
        try:
            self.deliver([(s.sink, o) for s, o in out])
        except Exception:  # the receiving side is gone (its loop closed): nothing to tell
            log.error("delivering outputs failed:\n%s", traceback.format_exc())


@dataclass
class _Step:
    """A launched decode step: rows[r] ran in row r; tokens [n] int64 on the device (the picks);
    host: their copy on the way to the host (pinned memory on CUDA), with `ready` its event."""

    rows: list[Sequence]
    tokens: torch.Tensor
    host: tuple[torch.Tensor, Any]
    launched_at: float

    def host_tokens(self) -> list[int]:
        values, ready = self.host
        if ready is not None:
            ready.synchronize()  # releases the GIL while it waits
        return values.tolist()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """t, or for an FP8 K/V cache its bytes (index_fill_ / index_copy_ have no float8 kernels;
    rows are copied bit for bit either way, and zero bits are +0.0)."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.is_floating_point() else t


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
