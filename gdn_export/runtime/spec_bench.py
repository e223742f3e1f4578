"""Timing of speculative decoding (gdn_export.runtime.speculative) against plain decoding on the same
runner: what `bench --speculative K` and benchmarks/spec_bench.py report.

One run: the prefill of prompts [B, T] and the first token (`SpeculativeDecoder.start`), then
rounds until every row has `decode_steps` more tokens (greedy), times between device
synchronisations; medians of `repeats` runs after `warmup`:

    prefill_ms            start(): the model's prefill, the first token, the MTP head's prefill
    decode_ms             the rounds (a round's tokens past a row's limit are not counted)
    decode_tokens_per_s   B * decode_steps / decode time
    tokens_per_step       tokens a verify step gave a row (accepted drafts + 1): the mean accepted length
    round_ms              decode time / rounds
    draft_ms, verify_ms   one draft phase (the head's catch-up call and K - 1 chained calls) and one
                          verify call (K + 1 tokens, every GDN state kept, logits of all of them), each
                          timed alone on the last run's buffers (replayed from a CUDA graph where
                          the rounds are)

Speedup over plain decode = tokens_per_step * plain_step_ms / round_ms; with every draft accepted and
free drafts it would be (K + 1) * plain_step_ms / verify_ms, the ceiling the verify step sets.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import numpy as np
import torch

from gdn_export.runtime.bench import sync
from gdn_export.runtime.speculative import SpeculativeDecoder

PART_ITERS = 20


def bench_speculative(runner, mtp, prompts: np.ndarray, k: int, decode_steps: int, warmup: int, repeats: int,
                      prefill_chunk: int | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Time greedy speculative decoding on `runner` with `mtp` (module docstring). prompts [B, T]
    int64 (host). Returns the keys of the module docstring, plus "generated" [B, decode_steps + 1]
    (the last run's tokens, the prefill's first), "rounds" and "acceptance_rate"."""
    decoder = SpeculativeDecoder(runner, mtp, k)
    device = runner.device
    B = prompts.shape[0]
    prefills, decodes, last = [], [], None
    for i in range(warmup + repeats):
        sync(device)
        t0 = time.perf_counter()
        session = decoder.start(list(prompts), decode_steps + 1, prefill_chunk)
        sync(device)
        t1 = time.perf_counter()
        while decoder.running(session):
            decoder.advance(session)
        sync(device)
        t2 = time.perf_counter()
        if i >= warmup:
            prefills.append((t1 - t0) * 1e3)
            decodes.append((t2 - t1) * 1e3)
        last = decoder.result(session, decode_steps + 1)
        if progress:
            kind = "warm-up" if i < warmup else "run"
            progress(f"speculative K={k} {kind}: prefill {(t1 - t0) * 1e3:.2f} ms, {session.rounds} rounds "
                     f"of {(t2 - t1) * 1e3 / max(session.rounds, 1):.3f} ms, {last.tokens_per_step:.2f} "
                     f"tokens per step")
    decode_ms = statistics.median(decodes)
    out = {"k": k, "prefill_ms": statistics.median(prefills), "decode_ms": decode_ms,
           "decode_tokens_per_s": B * decode_steps / decode_ms * 1e3, "rounds": last.rounds,
           "round_ms": decode_ms / max(last.rounds, 1), "tokens_per_step": last.tokens_per_step,
           "acceptance_rate": last.acceptance_rate, "cuda_graph": decoder.cuda_graph,
           "generated": last.generated}
    out.update(time_parts(decoder, session))
    return out


def time_parts(decoder: SpeculativeDecoder, session, iters: int = PART_ITERS) -> dict:
    """{"draft_ms", "verify_ms"}: one draft phase and one verify call on `session` (after its last
    round: what they write lands past every row's length), each the mean of `iters` runs, from a
    CUDA graph of that part when the decoder captures its rounds."""
    s = session
    active = torch.ones(s.batch, dtype=torch.bool, device=decoder.device)
    act = active.long()
    drafts = torch.zeros(s.batch, decoder.k, dtype=torch.int64, device=decoder.device)

    def draft():
        decoder._drafts(s, active)

    def verify():
        decoder._verify(s, drafts, act)

    return {"draft_ms": _time(decoder, draft, iters), "verify_ms": _time(decoder, verify, iters)}


def _time(decoder: SpeculativeDecoder, fn: Callable[[], None], iters: int) -> float:
    device = decoder.device
    with torch.no_grad(), decoder.runner._backend_context():
        fn()  # warm-up (lazy initialisation, Triton compiles)
        run = fn
        if decoder.cuda_graph:
            from gdn_export.runtime.cuda_graph import capture_graph

            run = capture_graph(fn, device, "a part of a speculative round", "cuda_graph=False", 1).replay
        sync(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            run()
        sync(device)
        return (time.perf_counter() - t0) * 1e3 / iters


def agreement(got: np.ndarray, want: np.ndarray) -> dict:
    """Speculative tokens got [B, N] against plain greedy decoding's want [B, N]: "tokens_equal_plain"
    (all equal), "rows_equal_plain" (rows equal throughout) and "first_difference" (the earliest
    position at which a row differs, None when none does)."""
    diff = got != want
    rows = diff.any(1)
    return {"tokens_equal_plain": bool(not rows.any()), "rows_equal_plain": int((~rows).sum()),
            "first_difference": int(diff.argmax(1)[rows].min()) if rows.any() else None}


def difference_margin(runner, prompts: np.ndarray, got: np.ndarray, want: np.ndarray) -> dict:
    """Where speculative tokens got [B, N] first differ from plain greedy decoding's want [B, N]
    (prompts [B, T] int64, host): the model's top-2 logit gap at that position, from one prefill of
    the row's prompt and its plain tokens before it on `runner`, and the rank of the speculative
    token there. A gap within the dtype's rounding of the logits says the two paths' sums (one call
    of K + 1 tokens, K + 1 calls of one) broke a near-tie; a wide one says a defect. {} when no
    row differs."""
    diff = got != want
    if not diff.any():
        return {}
    at = np.where(diff.any(1), diff.argmax(1), diff.shape[1])
    b = int(at.argmin())
    j = int(at[b])
    row = np.concatenate([prompts[b], want[b, :j]])[None]
    with torch.no_grad():
        logits, _ = runner.forward(row, np.zeros(1, np.int64), runner.empty_states(1))
    last = torch.as_tensor(np.asarray(logits))[0, -1].double()
    top = last.topk(2).values
    return {"difference_row": b, "difference_gap": float(top[0] - top[1]),
            "difference_rank": int((last > last[int(got[b, j])]).sum()), "difference_logit": float(top[0])}


def measure_speculative(checkpoint, runner, model, prompts: np.ndarray, k: int, setup, result: dict) -> dict:
    """`bench --speculative K`: greedy speculative decoding with the checkpoint's MTP head on the timed
    runner (`bench_speculative`), whether its tokens are plain greedy decoding's, its speedup over the
    plain decode of `result` (gdn_export.runtime.bench_checkpoint.measure) and the verify step's cost
    against a plain step. prompts [B, T] int64 (host)."""
    from gdn_export.weights.mtp import load_mtp

    setup.progress(f"speculative: loading the MTP head, K = {k}")
    mtp = load_mtp(checkpoint, model)
    out = bench_speculative(runner, mtp, prompts, k, setup.decode_steps, setup.warmup, setup.repeats,
                            setup.prefill_chunk, setup.progress)
    ids = torch.from_numpy(prompts).to(runner.device)
    logits, states = runner.prefill_device(ids, runner.empty_states(len(prompts)), setup.prefill_chunk)
    first = logits[:, -1].argmax(-1)[:, None]
    picked, _, _ = runner.decode_greedy(first, np.full(len(prompts), prompts.shape[1], np.int64), states,
                                        setup.decode_steps)
    plain = np.concatenate([first.cpu().numpy(), picked.cpu().numpy()], 1)
    generated = out.pop("generated")
    out.update(agreement(generated, plain))
    out.update(difference_margin(runner, prompts, generated, plain))
    out["speedup"] = out["decode_tokens_per_s"] / result["decode_tokens_per_s"]
    out["verify_over_plain_step"] = out["verify_ms"] / result["decode_ms_per_step"]
    return out
