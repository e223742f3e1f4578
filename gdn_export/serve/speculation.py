"""Speculative decoding in the engine (`gdn-export serve --speculative K`): the checkpoint's MTP head
drafts K tokens for every decode row, one verify call of the model checks them, and each row keeps the
longest prefix the model agrees with plus the model's own token (gdn_export.runtime.speculative, whose
round this runs on the engine's rows).

Rows. Besides the model's states, each row of the decode pool and of the staging set holds the head's
K/V cache and its catch-up inputs (the positions the head has not seen yet: their tokens, the model's
hidden states there, how many, from which position); `extra_states(rows)` makes them, and the engine
keeps them in its row sets, so they are zeroed, prefilled, promoted and compacted with the rest.

Prefill. Each chunk runs the model keeping its hidden states (the first token comes from the last
position's logits), then the head over the chunk: position p reads the model's hidden state at p and
the token at p + 1, so a chunk of tokens a .. a+n-1 feeds the head positions a-1 .. a+n-2 (position
a-1's hidden state carried over from the chunk before; the first chunk starts at position 0 with
n - 1 of them). The last prompt position waits for the first generated token: it is the first
round's catch-up.

Rounds. One round over the pool's n rows emits 1 .. K+1 tokens a row; the engine hands them out one
by one (a stop token or max_tokens ends the row there; tokens after it are dropped). A greedy request
gets exactly the tokens of plain greedy decoding. A sampling request drafts from the head's
distribution and keeps drafts by the standard rejection rule, both under its own temperature, top_k
and top_p and from its own generator (a seed), so its tokens follow the distribution plain sampling
draws them from (the same filter applied to the model's logits). A round of n rows runs on the
smallest bound batch size >= n (`bind`: powers of two and the pool's rows), rows n.. sitting it out;
on a CUDA GraphRunner each size's greedy round is a CUDA graph, replayed when every row of the round
is greedy (eager otherwise). A round's tokens are read back before the next round.
"""

from __future__ import annotations

from typing import Callable
from typing import Sequence as Seq

import numpy as np
import torch

from gdn_export.errors import InputError
from gdn_export.runtime.speculative import SpecSession, SpeculativeDecoder, rejection_accept
from gdn_export.serve.sampling import SamplingParams, draw, probabilities, uniforms


class _RowDecoder(SpeculativeDecoder):
    """The runtime's decoder with each row's own sampling: greedy rows as SpeculativeDecoder at
    temperature 0; a sampling row drafts from the head's distribution and accepts by the rejection
    rule, both under its own temperature, top_k and top_p (gdn_export.serve.sampling.probabilities)
    and with its own generator. Set `params`, `generators` and `shared` before each round."""

    params: list[SamplingParams] = []
    generators: list = []
    shared: torch.Generator | None = None

    def _sampling(self) -> list[int]:
        return [i for i, p in enumerate(self.params) if not p.greedy]

    def _draft_pick(self, logits):
        d, _ = super()._draft_pick(logits)  # temperature 0: the argmax
        rows = self._sampling()
        if not rows:
            return d, None
        index = torch.tensor(rows, device=logits.device)
        q = torch.zeros_like(logits)  # greedy rows: unused
        q_rows = probabilities(logits.index_select(0, index), [self.params[i] for i in rows])
        q.index_copy_(0, index, q_rows)
        d = d.index_copy(0, index, draw(q_rows, [self.generators[i] for i in rows], self.shared))
        return d, q

    def _accept(self, logits, drafts, q):
        accepted, token = super()._accept(logits, drafts, None)  # temperature 0: greedy
        rows = self._sampling()
        if rows and q is None:
            raise InputError("a stub draft gives no draft distribution: greedy requests only")
        if rows:
            index = torch.tensor(rows, device=logits.device)
            params = [self.params[i] for i in rows]
            gens = [self.generators[i] for i in rows]
            r, k1, vocab = len(rows), logits.shape[1], logits.shape[2]
            p = probabilities(logits.index_select(0, index).reshape(r * k1, vocab),
                              [x for x in params for _ in range(k1)]).reshape(r, k1, vocab)
            u = uniforms((r, self.k), gens, self.shared, logits.device)
            acc, tok = rejection_accept(p, q.index_select(0, index), drafts.index_select(0, index), u,
                                        lambda dist: draw(dist, gens, self.shared))
            accepted = accepted.index_copy(0, index, acc)
            token = token.index_copy(0, index, tok)
        return accepted, token


def _pad_rows(drafts: torch.Tensor, rows: int) -> torch.Tensor:
    """A test draft's [n, K] drafts for the round's first n rows, zero-padded to its `rows`."""
    if drafts.shape[0] >= rows:
        return drafts
    return torch.cat((drafts, drafts.new_zeros(rows - drafts.shape[0], drafts.shape[1])))


class Speculation:
    """K drafts a round from `mtp` (gdn_export.weights.mtp.load_mtp of the runner's checkpoint) for
    the engine over `runner` (module docstring). draft: a stand-in for the head's drafts in tests,
    draft(speculation, session) -> drafts [n, K] int64 (speculation.rows: the round's Sequences)."""

    def __init__(self, runner, mtp, k: int, draft: Callable | None = None):
        stub = None if draft is None else (lambda session: _pad_rows(draft(self, session), session.batch))
        self.decoder = _RowDecoder(runner, mtp, k, temperature=0.0, cuda_graph=False, draft=stub)
        self.runner, self.model, self.mtp, self.k = runner, runner.model, self.decoder.mtp, self.decoder.k
        self.device = runner.device
        # greedy rounds replayed from CUDA graphs: on a CUDA GraphRunner with graphs, the head drafting
        self.cuda_graph = bool(getattr(runner, "cuda_graph", False)) and self.device.type == "cuda" and draft is None
        self.rows: list = []
        self._sessions: dict[int, SpecSession] = {}

    @property
    def cache_slots(self) -> int:
        """Slots a sequence needs beyond its prompt and max_tokens: a round writes K + 1 past the
        row's last token, also in its last round (runtime.speculative.cache_slots_needed)."""
        return 2 * self.k

    def extra_states(self, rows: int) -> list[torch.Tensor]:
        """Per-row tensors of `rows` rows: the head's K/V cache, then catch_tokens [rows, K+1],
        catch_hidden [rows, K+1, hidden], catch_count [rows], mtp_past [rows]."""
        dev, K, H = self.device, self.k, self.model.config.hidden_size
        return [*self.mtp.empty_states(rows, dev), torch.zeros(rows, K + 1, dtype=torch.int64, device=dev),
                torch.zeros(rows, K + 1, H, dtype=self.model.dtype, device=dev),
                torch.zeros(rows, dtype=torch.int64, device=dev), torch.zeros(rows, dtype=torch.int64, device=dev)]

    def _split(self, extra: list[torch.Tensor], n: int):
        """(head K/V views, catch_tokens, catch_hidden, catch_count, mtp_past) of rows 0..n-1."""
        *kv, tokens, hidden, count, past = (t[:n] for t in extra)
        return kv, tokens, hidden, count, past

    def prefill(self, ids: torch.Tensor, past: torch.Tensor, lens: torch.Tensor, states: list[torch.Tensor],
                extra: list[torch.Tensor]) -> torch.Tensor:
        """One prefill chunk of m staging rows: ids [m, w], past [m] (prompt tokens already in the
        cache), lens [m] (>= 1) int64 on the device; states and extra: the rows' views. Returns the
        logits at each row's last real position [m, V] fp32."""
        m, w = ids.shape
        kv, _, carry, count, head_past = self._split(extra, m)
        with self.runner._backend_context():
            hidden, *new = self.model.hidden_states(ids, past, lens, *states)
            SpeculativeDecoder._store(states, new)
            rows = torch.arange(m, device=self.device)
            last = hidden[rows, lens - 1]
            logits = self.model.lm_head(last).float()
            # the head: tokens a .. a+n-1 at positions a-1 .. a+n-2 (hidden: carried, then this chunk's)
            first = past == 0
            shifted_ids = torch.cat((ids[:, 1:], ids[:, :1]), 1)
            tok = torch.where(first[:, None], shifted_ids, ids)
            before = torch.cat((carry[:, :1], hidden[:, :w - 1]), 1)
            hid = torch.where(first[:, None, None], hidden, before)
            n = lens - first.long()
            start = torch.where(first, past, past - 1)
            _, _, *new_kv = self.mtp(tok, hid, start, n, *kv)
            SpeculativeDecoder._store(kv, new_kv)
            carry[:, 0] = last
            head_past.copy_(start + n)
            count.zero_()
        return logits

    def first_tokens(self, extra: list[torch.Tensor], rows: Seq[int], tokens: Seq[int]) -> None:
        """Rows whose prompt is done picked `tokens`: the first round's catch-up is the last prompt
        position with that token (its hidden state is already in place)."""
        index = torch.tensor(list(rows), device=self.device)
        _, catch_tokens, _, count, _ = self._split(extra, len(extra[0]))
        catch_tokens[:, 0].index_copy_(0, index, torch.tensor(list(tokens), device=self.device))
        count.index_fill_(0, index, 1)

    def bind(self, states: list[torch.Tensor], extra: list[torch.Tensor], batch_sizes) -> None:
        """Round sessions over the pool's first b rows for each b in `batch_sizes` (the model's states
        and `extra_states` of the pool); a round of n rows runs at the smallest b >= n, rows n.. sitting
        it out. With CUDA graphs each size's greedy round is captured now, its warm-up rounds writing
        into the rows: bind before they hold anything (they are zeroed after)."""
        from gdn_export.runtime.cuda_graph import capture_graph
        from gdn_export.runtime.speculative import WARMUP_ROUNDS

        dev, K = self.device, self.k
        self._sessions = {}
        for b in sorted({int(b) for b in batch_sizes}):
            kv, catch_tokens, catch_hidden, count, head_past = self._split(extra, b)
            longs = lambda *shape: torch.zeros(shape, dtype=torch.int64, device=dev)  # noqa: E731
            session = SpecSession(prompts=[], states=[t[:b] for t in states], mtp_states=kv, past=longs(b),
                                  pending=longs(b), catch_tokens=catch_tokens, catch_hidden=catch_hidden,
                                  catch_count=count, mtp_past=head_past, generated=longs(b, K + 1), emitted=longs(b),
                                  limit=longs(b), accepted=longs(b), verified=longs(b))
            if self.cuda_graph:
                session.limit.fill_(1)
                self._params(b, [], None)
                with torch.no_grad(), self.runner._backend_context():
                    session.graph = capture_graph(lambda s=session: self.decoder._round(s), dev,
                                                  f"a speculative round of {b} rows", "--no-cuda-graph", WARMUP_ROUNDS)
            self._sessions[b] = session
        for t in (*states, *extra):
            t.zero_()

    def _params(self, size: int, rows: Seq, shared) -> None:
        """The decoder's per-row sampling for a round of `size` rows: `rows`' own, greedy past them."""
        self.decoder.params = [s.params for s in rows] + [SamplingParams()] * (size - len(rows))
        self.decoder.generators = [s.generator for s in rows] + [None] * (size - len(rows))
        self.decoder.shared = shared

    def round(self, rows: Seq, shared: torch.Generator) -> list[np.ndarray]:
        """One round over the bound pool's rows 0..n-1, held by `rows` (gdn_export.serve.scheduler.
        Sequence, in row order: each one's next_position tokens are in its row's cache, its last
        generated token is the one to run next); shared: the generator of sampling requests without a
        seed. Replayed from its CUDA graph when every row is greedy. Returns each row's new tokens
        (1 .. K + 1)."""
        n = len(rows)
        size = next((b for b in self._sessions if b >= n), None)  # dict order: ascending sizes
        if size is None:
            raise InputError(f"{n} rows exceed the largest bound batch size {max(self._sessions, default=0)}")
        s = self._sessions[size]
        self.rows = list(rows)
        values = torch.zeros(3, size, dtype=torch.int64)
        values[0, :n] = torch.tensor([q.next_position for q in rows])
        values[1, :n] = torch.tensor([q.generated[-1] for q in rows])
        values[2, :n] = 1  # limit: rows n.. sit the round out
        values = values.to(self.device)
        s.past.copy_(values[0])
        s.pending.copy_(values[1])
        s.limit.copy_(values[2])
        s.emitted.zero_()
        self._params(size, rows, shared)
        with torch.no_grad(), self.runner._backend_context():
            if s.graph is not None and all(q.params.greedy for q in rows):
                s.graph.replay()
            else:
                self.decoder._round(s)
        kept = s.emitted[:n].cpu().numpy()
        generated = s.generated[:n].cpu().numpy()
        return [generated[b, :kept[b]] for b in range(n)]
