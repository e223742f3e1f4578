"""Speculative decoding with the checkpoint's own MTP head, lossless, on the torch runners.

Every round, for each row still generating (row b: `past` tokens seen by the model, then its
`pending` token, picked but not yet run):

1. draft: the MTP head (gdn_export.models.mtp) takes the model's hidden states at the positions
   verified last round with the tokens that followed them (the accepted drafts and the correction:
   up to K + 1 positions, one call) and predicts d_1; K - 1 one-token calls chain d_2 .. d_K, each
   feeding the head's own hidden state back.
2. verify: the model runs [pending, d_1 .. d_K] (K + 1 tokens) in one call, every GDN layer keeping
   its state after each token (gdn_export.models.verify).
3. accept: greedy (temperature 0): the longest prefix of drafts that equal the model's argmax, then
   the model's own token after them (the correction, or a bonus token when all K are accepted).
   Sampled (temperature > 0): the standard rejection rule: d_i is kept with probability
   min(1, p(d_i) / q(d_i)) (p: the model's distribution, q: the head's, both at the temperature);
   at the first rejection the token is drawn from max(0, p - q) renormalised, and after K
   acceptances from p: the tokens are distributed as the model's own sampling.
4. roll back: the GDN conv and recurrent states to the row's accepted length; the K/V caches (the
   model's and the head's) by length alone.

Greedy output is the model's greedy output token for token, up to the floating-point difference
between one call of K + 1 tokens and K + 1 calls of one (matrix products that block differently;
see docs/speculative.md). Rows finish independently (each has its own limit) and then sit the
rounds out. A round reads nothing back to the host: on a CUDA GraphRunner (greedy) the whole round
is captured as one CUDA graph; the host reads the finished-row count once a round.

API: `SpeculativeDecoder(runner, mtp, k)`, then `generate(prompts, max_new_tokens)`, or, for a
server, `start(prompts, limits)` and `step(session)` (one round: each row's new tokens).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from gdn_export.errors import InputError
from gdn_export.layout import LOGITS_LAST
from gdn_export.models.verify import check_layout, roll_back
from gdn_export.modules.fused_linear import fuse_linears
from gdn_export.modules.kv_cache import tokens_until_wrap
from gdn_export.runtime.base import as_prompts, pad_rows

MAX_K = 16
WARMUP_ROUNDS = 3  # before a capture, as GraphRunner.WARMUP_CALLS


def cache_slots_needed(prompt_len: int, max_new_tokens: int, k: int) -> int:
    """Cache slots speculative decoding needs for a row: a round writes K + 1 slots past the row's
    length, also for a row that finished (it sits the round out, its padded tokens still land in
    slots), whose length can reach prompt + max_new_tokens + K - 1."""
    return prompt_len + max_new_tokens + 2 * k


@dataclass
class SpecSession:
    """One batch being generated: device tensors, updated in place by every round (so that a CUDA
    graph of the round reads and writes the same buffers).

    states, mtp_states  the model's (gdn_export.models.cache) and the head's K/V cache
    past [B]            tokens the model has seen; pending [B] the next token to run
    catch_tokens [B, K+1], catch_hidden [B, K+1, hidden], catch_count [B], mtp_past [B]
                        the head's next input: catch_count positions from mtp_past on
    generated [B, cap], emitted [B], limit [B]
                        each row's tokens so far (the first is the prefill's), how many, the most
    accepted [B], verified [B]
                        drafts accepted, verify rounds taken part in (statistics)
    """

    prompts: list[np.ndarray]
    states: list[torch.Tensor]
    mtp_states: list[torch.Tensor]
    past: torch.Tensor
    pending: torch.Tensor
    catch_tokens: torch.Tensor
    catch_hidden: torch.Tensor
    catch_count: torch.Tensor
    mtp_past: torch.Tensor
    generated: torch.Tensor
    emitted: torch.Tensor
    limit: torch.Tensor
    accepted: torch.Tensor
    verified: torch.Tensor
    rounds: int = 0
    graph: object = None

    @property
    def batch(self) -> int:
        return self.past.shape[0]


@dataclass
class SpecResult:
    """prompts; generated [B, N] int64 (N = max_new_tokens); per row: accepted (drafts kept) and
    verify_steps (rounds taken part in); rounds in all."""

    prompts: list[np.ndarray]
    generated: np.ndarray
    accepted: np.ndarray
    verify_steps: np.ndarray
    rounds: int
    k: int
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens a verify step gave a row (accepted drafts + the model's own token): the mean
        accepted length, 1 .. K + 1."""
        steps = int(self.verify_steps.sum())
        return float((self.accepted.sum() + steps) / steps) if steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Fraction of the drafts that were accepted."""
        drafted = int(self.verify_steps.sum()) * self.k
        return float(self.accepted.sum() / drafted) if drafted else 0.0

    def rows(self) -> list[np.ndarray]:
        return [np.concatenate([p, g]) for p, g in zip(self.prompts, self.generated)]


class SpeculativeDecoder:
    """Speculative decoding on `runner` (a TorchRunner or GraphRunner of a HybridForCausalLM) with
    `mtp` (the checkpoint's MTP head beside that model: gdn_export.weights.mtp.load_mtp), K drafts a
    round (module docstring).

    temperature: 0 = greedy, else sampling at that temperature (seed: its generator's seed).
    cuda_graph: capture each round as a CUDA graph (default: on a CUDA GraphRunner, greedy, no stub).
    draft: a stand-in for the head in tests: draft(session) -> drafts [B, K] int64 on the device
    (greedy only); the head is then not run.
    """

    def __init__(self, runner, mtp, k: int, temperature: float = 0.0, seed: int | None = None,
                 cuda_graph: bool | None = None, draft: Callable | None = None) -> None:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= MAX_K:
            raise InputError(f"speculative drafts K must be an integer in [1, {MAX_K}], got {k!r}")
        if not isinstance(temperature, (int, float)) or not np.isfinite(temperature) or temperature < 0:
            raise InputError(f"temperature must be a finite number >= 0, got {temperature!r}")
        model = runner.model
        check_layout(model.layout)
        if mtp.config is not model.config and mtp.config != model.config:
            raise InputError("the MTP head belongs to another model")
        if draft is not None and temperature > 0:
            raise InputError("a stub draft gives no draft distribution: greedy only")
        self.runner, self.model, self.mtp = runner, model, mtp
        self.k, self.temperature = int(k), float(temperature)
        self.device = runner.device
        self.draft = draft
        self.mtp.to(self.device)
        if getattr(runner, "cuda_graph", None) is not None:  # a GraphRunner: fused projections too
            fuse_linears(self.mtp.mtp)
        # the head's logits and hidden state at each row's last real token (what a draft needs)
        self.mtp.layout = dataclasses.replace(model.layout, logits=LOGITS_LAST)
        self.mtp.check_inputs = model.check_inputs
        self.generator = None
        if self.temperature > 0:
            self.generator = torch.Generator(self.device)
            self.generator.manual_seed(int(seed) if seed is not None else int(torch.seed() % 2**63))
        graphs = self.device.type == "cuda" and getattr(runner, "cuda_graph", False)
        self.cuda_graph = (graphs and self.temperature == 0 and draft is None) if cuda_graph is None \
            else bool(cuda_graph)
        if self.cuda_graph and (self.device.type != "cuda" or self.temperature > 0 or draft is not None):
            raise InputError("CUDA graphs of the round need a CUDA device, greedy decoding and the MTP head")
        self._sessions: dict[int, SpecSession] = {}

    # ------------------------------------------------------------------ public
    def generate(self, input_ids, max_new_tokens: int, prefill_chunk: int | None = None,
                 on_round: Callable[[list[np.ndarray]], None] | None = None) -> SpecResult:
        """Prefill the prompts (input_ids [B, T], or B sequences of their own lengths), then run
        rounds until every row has max_new_tokens tokens. on_round(new tokens of each row) after
        the prefill's first token and after every round."""
        prompts = as_prompts(input_ids, self.runner.vocab_size)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
                or max_new_tokens < 0:
            raise InputError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        if max_new_tokens == 0:
            empty = np.zeros(len(prompts), np.int64)
            return SpecResult(prompts, np.zeros((len(prompts), 0), np.int64), empty, empty, 0, self.k)
        session = self.start(prompts, max_new_tokens, prefill_chunk)
        if on_round is not None:
            on_round([session.generated[b, :1].cpu().numpy() for b in range(session.batch)])
        while self.running(session):
            new = self.step(session)
            if on_round is not None:
                on_round(new)
        return self.result(session, max_new_tokens)

    def start(self, prompts: Sequence[np.ndarray], limits, prefill_chunk: int | None = None) -> SpecSession:
        """Prefill `prompts` (1-D int64 arrays) and pick each row's first token; limits: the tokens
        each row generates (one int, or one per row), at least 1."""
        prompts = as_prompts(prompts, self.runner.vocab_size)
        B = len(prompts)
        limit = np.broadcast_to(np.asarray(limits, np.int64), (B,)).copy()
        if (limit < 1).any():
            raise InputError(f"every row must generate at least 1 token, got limits {limit.tolist()}")
        lens = np.array([len(p) for p in prompts], np.int64)
        need = max(cache_slots_needed(int(n), int(m), self.k) for n, m in zip(lens, limit))
        if need > self.model.layout.cache_len:
            raise InputError(f"speculative decoding of {int(limit.max())} tokens after a prompt of "
                             f"{int(lens.max())} with K = {self.k} needs {need} cache slots; the model "
                             f"has {self.model.layout.cache_len}")
        session = self._session(B)
        with torch.no_grad(), self.runner._backend_context():
            self._reset(session, prompts, limit)
            self._prefill(session, prompts, lens, prefill_chunk)
        return session

    def running(self, session: SpecSession) -> bool:
        """Whether a row still generates (one host read)."""
        return bool((session.emitted < session.limit).any())

    def step(self, session: SpecSession) -> list[np.ndarray]:
        """One round (module docstring); returns each row's new tokens (empty once it is done)."""
        before = session.emitted.cpu().numpy().copy()
        self.advance(session)
        after = session.emitted.cpu().numpy()
        limit = session.limit.cpu().numpy()
        generated = session.generated.cpu().numpy()
        return [generated[b, before[b]:min(after[b], limit[b])] for b in range(session.batch)]

    def advance(self, session: SpecSession) -> None:
        """One round, without reading anything back (the tokens stay in session.generated)."""
        with torch.no_grad(), self.runner._backend_context():
            if session.graph is not None:
                session.graph.replay()
            else:
                self._round(session)
        session.rounds += 1

    def result(self, session: SpecSession, max_new_tokens: int) -> SpecResult:
        """The session's tokens as a SpecResult (each row cut to max_new_tokens)."""
        generated = session.generated[:, :max_new_tokens].cpu().numpy()
        return SpecResult(session.prompts, generated, session.accepted.cpu().numpy(),
                          session.verified.cpu().numpy(), session.rounds, self.k)

    # ------------------------------------------------------------------ setup
    def _session(self, B: int) -> SpecSession:
        """The buffers of batch size B (kept, with their CUDA graph, for the next generation)."""
        session = self._sessions.get(B)
        if session is not None:
            return session
        dev, K, H = self.device, self.k, self.model.config.hidden_size
        cap = self.model.layout.cache_len + K + 1

        def longs(*shape):
            return torch.zeros(shape, dtype=torch.int64, device=dev)

        session = SpecSession(
            prompts=[], states=list(self.runner.empty_states(B)), mtp_states=self.mtp.empty_states(B, dev),
            past=longs(B), pending=longs(B), catch_tokens=longs(B, K + 1),
            catch_hidden=torch.zeros(B, K + 1, H, dtype=self.model.dtype, device=dev),
            catch_count=longs(B), mtp_past=longs(B), generated=longs(B, cap), emitted=longs(B),
            limit=longs(B), accepted=longs(B), verified=longs(B))
        if self.cuda_graph:
            self._capture(session)
        self._sessions[B] = session
        return session

    def _capture(self, session: SpecSession) -> None:
        """Capture `_round` on the session's buffers (warm-up first; `_reset` clears what the
        warm-up wrote)."""
        from gdn_export.runtime.cuda_graph import capture_graph

        with torch.no_grad(), self.runner._backend_context():
            session.limit.fill_(1)
            session.graph = capture_graph(lambda: self._round(session), self.device, "a speculative round",
                                          "cuda_graph=False", WARMUP_ROUNDS)

    def _reset(self, session: SpecSession, prompts, limit: np.ndarray) -> None:
        session.prompts = list(prompts)
        for t in session.states + session.mtp_states:
            t.zero_()
        for t in (session.past, session.pending, session.catch_tokens, session.catch_hidden,
                  session.catch_count, session.mtp_past, session.generated, session.emitted,
                  session.accepted, session.verified):
            t.zero_()
        session.limit.copy_(torch.from_numpy(limit))
        session.rounds = 0

    def _prefill(self, s: SpecSession, prompts, lens: np.ndarray, chunk: int | None) -> None:
        """The model over the prompts (hidden states kept), the first token, then the head over
        positions 0 .. n-2 (token p + 1 with hidden p): the round's first catch-up is position
        n - 1 with the first token."""
        model, dev, B = self.model, self.device, len(prompts)
        layout = model.layout
        chunk = chunk or self.runner.default_prefill_chunk(B, int(lens.max())) or int(lens.max())
        longest = int(lens.max())
        hidden = torch.zeros(B, longest, model.config.hidden_size, dtype=model.dtype, device=dev)
        past = np.zeros(B, np.int64)
        while (past < lens).any():
            size = int(min(chunk, tokens_until_wrap([int(p) for p in past], layout), (lens - past).max()))
            seq = np.minimum(lens - past, size)
            ids = pad_rows([p[o:o + size] for p, o in zip(prompts, past)], size)
            h, *new = model.hidden_states(torch.from_numpy(ids).to(dev), torch.from_numpy(past).to(dev),
                                          torch.from_numpy(seq).to(dev), *s.states)
            self._store(s.states, new)
            for b in np.flatnonzero(seq):
                hidden[b, past[b]:past[b] + seq[b]] = h[b, :seq[b]]
            past += seq
        # the first token, from each row's last prompt position
        rows = torch.arange(B, device=dev)
        last = torch.from_numpy(lens - 1).to(dev)
        h_last = hidden[rows, last]
        first = self._pick(model.lm_head(h_last).float())
        s.pending.copy_(first)
        s.generated[:, 0] = first
        s.emitted.fill_(1)
        s.past.copy_(torch.from_numpy(lens))
        # the head over positions 0 .. n-2, in calls of at most `chunk`
        if self.draft is None:
            head_lens = lens - 1
            done = np.zeros(B, np.int64)
            while (done < head_lens).any():
                size = int(min(chunk, (head_lens - done).max()))
                seq = np.minimum(head_lens - done, size)
                tok = pad_rows([p[1 + o:1 + o + size] for p, o in zip(prompts, done)], size)
                hid = torch.zeros(B, size, hidden.shape[-1], dtype=hidden.dtype, device=dev)
                for b in np.flatnonzero(seq):
                    hid[b, :seq[b]] = hidden[b, done[b]:done[b] + seq[b]]
                _, _, *kv = self.mtp(torch.from_numpy(tok).to(dev), hid, torch.from_numpy(done).to(dev),
                                     torch.from_numpy(seq).to(dev), *s.mtp_states)
                self._store(s.mtp_states, kv)
                done += seq
        s.catch_tokens[:, 0] = first
        s.catch_hidden[:, 0] = h_last
        s.catch_count.fill_(1)
        s.mtp_past.copy_(torch.from_numpy(lens - 1))

    @staticmethod
    def _store(buffers: list[torch.Tensor], new: list[torch.Tensor]) -> None:
        for buf, t in zip(buffers, new):
            if t is not buf:
                buf.copy_(t)

    # ------------------------------------------------------------------ one round
    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        """A token per row of logits [B, V] fp32: argmax, or a sample at the temperature."""
        if self.temperature == 0:
            return logits.argmax(-1)
        return _sample(torch.softmax(logits / self.temperature, -1), self.generator)

    def _drafts(self, s: SpecSession, active: torch.Tensor):
        """(drafts [B, K] int64, q [B, K, V] fp32 draft distributions or None when greedy)."""
        if self.draft is not None:
            return self.draft(s).to(self.device, torch.int64), None
        K = self.k
        act = active.long()
        logits, y, *kv = self.mtp(s.catch_tokens, s.catch_hidden, s.mtp_past, s.catch_count * act, *s.mtp_states)
        self._store(s.mtp_states, kv)
        drafts, qs = [], []
        for j in range(K):
            d, q = self._draft_pick(logits[:, -1])
            if q is not None:
                qs.append(q)
            drafts.append(d)
            if j + 1 < K:
                logits, y, *kv = self.mtp(d[:, None], y, s.past + j, act, *s.mtp_states)
                self._store(s.mtp_states, kv)
        return torch.stack(drafts, 1), (torch.stack(qs, 1) if qs else None)

    def _draft_pick(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A draft per row from the head's logits [B, V] fp32, and the distribution it was drawn
        from [B, V] (None: greedy, the argmax)."""
        if self.temperature == 0:
            return logits.argmax(-1), None
        q = torch.softmax(logits / self.temperature, -1)
        return _sample(q, self.generator), q

    def _verify(self, s: SpecSession, drafts: torch.Tensor, act: torch.Tensor):
        """The model over [pending, drafts] (K + 1 tokens) of the active rows (act [B] 0 / 1), every
        GDN state kept: (hidden [B, K+1, hidden], the verify form's states, logits fp32 [B, K+1, V]).
        The K/V caches are written in place; the GDN states are left as they were."""
        ids = torch.cat((s.pending[:, None], drafts), 1)
        hidden, *steps = self.model.hidden_states(ids, s.past, (self.k + 1) * act, *s.states, capture_steps=True)
        return hidden, steps, self.model.lm_head(hidden).float()

    def _round(self, s: SpecSession) -> None:
        """Draft, verify, accept, roll back (module docstring), in place on the session."""
        K = self.k
        active = s.emitted < s.limit
        act = active.long()
        drafts, q = self._drafts(s, active)
        hidden, steps, logits = self._verify(s, drafts, act)
        accepted, token = self._accept(logits, drafts, q)
        kept = (accepted + 1) * act
        roll_back(self.model, steps, kept, out=s.states)
        # this round's tokens: the accepted drafts, then the model's own token
        span = torch.arange(K + 1, device=self.device)
        out = torch.cat((drafts, drafts[:, :1]), 1)
        out = torch.where(span[None, :] == accepted[:, None], token[:, None], out)
        slots = s.emitted[:, None] + span
        write = (span[None, :] <= accepted[:, None]) & active[:, None]
        slots = slots.clamp(max=s.generated.shape[1] - 1)
        s.generated.scatter_(1, slots, torch.where(write, out, s.generated.gather(1, slots)))
        # the head's next catch-up: positions past .. past + accepted with the tokens after them
        keep = active[:, None]
        s.catch_tokens.copy_(torch.where(keep, out, s.catch_tokens))
        s.catch_hidden.copy_(torch.where(keep[..., None], hidden.to(s.catch_hidden.dtype), s.catch_hidden))
        s.catch_count.copy_(torch.where(active, accepted + 1, s.catch_count))
        s.mtp_past.copy_(torch.where(active, s.past, s.mtp_past))
        s.pending.copy_(torch.where(active, token, s.pending))
        s.past.add_(kept)
        s.emitted.add_(kept)
        s.accepted.add_(accepted * act)
        s.verified.add_(act)

    def _accept(self, logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None):
        """(accepted drafts [B] int64, the model's token after them [B]) from the verify logits
        [B, K+1, V] and the drafts [B, K] (q [B, K, V]: their distributions when sampling)."""
        K = self.k
        if self.temperature == 0:
            target = logits.argmax(-1)  # [B, K+1]
            match = (drafts == target[:, :K]).long()
            accepted = match.cumprod(1).sum(1)
            return accepted, target.gather(1, accepted[:, None])[:, 0]
        p = torch.softmax(logits / self.temperature, -1)  # [B, K+1, V]
        u = torch.rand(drafts.shape, generator=self.generator, device=p.device)
        return rejection_accept(p, q, drafts, u, lambda dist: _sample(dist, self.generator))


def rejection_accept(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, u: torch.Tensor,
                     draw: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The standard rejection rule (module docstring): p [B, K+1, V] the model's distributions at
    the verified positions, q [B, K, V] the ones the drafts [B, K] were drawn from, u [B, K] uniform
    draws; draw(dist [B, V], rows summing to 1) -> [B] tokens. Returns (accepted [B], the token after
    them [B]): the tokens are distributed as p's own sampling."""
    K = drafts.shape[1]
    p_d = p[:, :K].gather(-1, drafts[..., None])[..., 0]
    q_d = q.gather(-1, drafts[..., None])[..., 0]
    ok = (u * q_d < p_d).long()  # kept with probability min(1, p / q)
    accepted = ok.cumprod(1).sum(1)
    rows = torch.arange(p.shape[0], device=p.device)
    at = accepted.clamp(max=K - 1)
    residual = (p[rows, at] - q[rows, at]).clamp(min=0)
    # p == q at the rejected position leaves nothing to draw from: p itself (probability 0 event)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p[rows, at])
    dist = torch.where((accepted < K)[:, None], residual, p[:, K])
    return accepted, draw(dist / dist.sum(-1, keepdim=True))


def _sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of probs [B, V] (rows sum to 1): argmax of p / Exp(1), the exponential race,
    which draws i with probability p_i and needs no host sync."""
    race = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / race).argmax(-1)
