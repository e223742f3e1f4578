"""Speculative decoding over the exported graphs in ONNX Runtime (CPU): `NAME.verify.onnx` (the model,
K + 1 tokens a row, every GDN state kept) and `NAME.mtp.onnx` (the MTP head), as `gdn-export export
--speculative K` writes them (gdn_export.onnx.speculative).

The rounds are those of gdn_export.runtime.speculative (draft K tokens with the head, verify them in
one call, keep the longest accepted prefix and the model's token after it, roll the states back),
run on numpy arrays:

- prefill: the verify graph over the prompt in windows of K + 1 tokens (ragged: a row's last window
  holds what is left, a finished row sits the call out), each window's states rolled back to its
  real tokens; its hidden states give the head's prefill (positions 0 .. n-2) and its last logits
  the first token. The model's own graph (`NAME.onnx`) has no hidden-state output, so this is the
  one graph that gives both.
- roll-back: per row, the conv window columns kept .. kept + W-2 and the recurrent state after the
  kept-th token; the K/V caches by length (no query reads a slot past its position; the next call
  overwrites them).
- accept: greedy, or at a temperature the rejection rule (gdn_export.runtime.speculative's
  rejection_accept, on torch CPU tensors), so that the tokens follow the model's own sampling.

Greedy output equals plain greedy decoding through the model's graph in ONNX Runtime, up to the
floating-point difference between one call of K + 1 tokens and K + 1 calls of one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from gdn_export.errors import GdnExportError, InputError
from gdn_export.onnx import bf16, metadata, ort_native
from gdn_export.runtime.base import as_prompts, pad_rows

_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}
ROLES = ("verify", "mtp")


class _Graph:
    """One speculative graph in an ONNX Runtime CPU session: its metadata, inputs and outputs."""

    def __init__(self, path, role: str, kernels: str):
        import onnxruntime as ort

        self.path = Path(path)
        if not self.path.is_file():
            raise InputError(f"{self.path}: no such ONNX file (`gdn-export export --speculative K` writes it)")
        try:
            proto = onnx.load(str(self.path))
        except DecodeError as exc:
            raise InputError(f"{self.path}: not an ONNX model (protobuf could not parse it: {exc})") from None
        self.meta = {p.key: p.value for p in proto.metadata_props}
        got = self.meta.get(metadata.KEY_SPECULATIVE_ROLE)
        if got != role:
            raise InputError(f"{self.path}: not the {role} graph of `export --speculative` "
                             f"({'the ' + got + ' graph' if got else 'no speculative role in its metadata'})")
        try:
            self.layout = metadata.read_layout(self.meta)
            plan = ort_native.prepare(bf16.emulate_bf16(proto) if bf16.has_bf16(proto) else proto, kernels)
        except (GdnExportError, KeyError, ValueError) as exc:
            raise InputError(f"{self.path}: {exc}") from None
        self.kernels_note = plan.note
        options = ort.SessionOptions()
        options.log_severity_level = 3  # TensorScatter's note that it copies the cache without IOBinding
        self.session = ort.InferenceSession(plan.model.SerializeToString(), options,
                                            providers=["CPUExecutionProvider"])
        self.inputs = self.session.get_inputs()
        self.outputs = [o.name for o in self.session.get_outputs()]

    def zeros(self, name: str, batch: int) -> np.ndarray:
        """Zero input `name` for `batch` rows (its dims but the batch are fixed)."""
        spec = next(i for i in self.inputs if i.name == name)
        return np.zeros([batch if not isinstance(d, int) else d for d in spec.shape], _NUMPY[spec.type])

    def run(self, feeds: dict) -> dict:
        cast = {i.name: np.ascontiguousarray(feeds[i.name], dtype=_NUMPY[i.type]) for i in self.inputs}
        return dict(zip(self.outputs, self.session.run(None, cast)))


class OrtSpeculativeDecoder:
    """Speculative decoding of the verify graph `verify_path` with the head `mtp_path` (module
    docstring). temperature 0 = greedy, else sampling at that temperature (seed: its generator's).
    kernels: how ONNX Runtime runs the GDN nodes (gdn_export.onnx.ort_native)."""

    def __init__(self, verify_path, mtp_path, temperature: float = 0.0, seed: int | None = None,
                 kernels: str = "auto"):
        if not isinstance(temperature, (int, float)) or not np.isfinite(temperature) or temperature < 0:
            raise InputError(f"temperature must be a finite number >= 0, got {temperature!r}")
        self.verify = _Graph(verify_path, "verify", kernels)
        self.mtp = _Graph(mtp_path, "mtp", kernels)
        v, m = self.verify.meta, self.mtp.meta
        for key in (metadata.KEY_FAMILY, metadata.KEY_VOCAB):
            if v.get(key) != m.get(key):
                raise InputError(f"{self.mtp.path} was not exported with {self.verify.path} ({key}: "
                                 f"{m.get(key)} against {v.get(key)})")
        self.k = int(v[metadata.KEY_SPECULATIVE_K])
        self.vocab_size = int(v[metadata.KEY_VOCAB])
        self.layout = self.verify.layout
        self.temperature = float(temperature)
        self.kernels_note = self.verify.kernels_note
        names = [i.name for i in self.verify.inputs]
        self.state_names = names[3:]  # past.{i}.* after input_ids, past_lengths, seq_lens
        self.mtp_state_names = [i.name for i in self.mtp.inputs][4:]  # after input_ids, hidden, past, lens
        self.generator = None
        if self.temperature > 0:
            import torch

            self.generator = torch.Generator().manual_seed(int(seed) if seed is not None else
                                                           int(torch.seed() % 2**63))

    # ------------------------------------------------------------------ public
    def generate(self, input_ids, max_new_tokens: int):
        """Prefill the prompts (input_ids [B, T], or B sequences of their own lengths), then rounds
        until every row has max_new_tokens tokens: a gdn_export.runtime.speculative.SpecResult."""
        from gdn_export.runtime.speculative import SpecResult, cache_slots_needed

        prompts = as_prompts(input_ids, self.vocab_size)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
                or max_new_tokens < 0:
            raise InputError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        B, K = len(prompts), self.k
        lens = np.array([len(p) for p in prompts], np.int64)
        need = cache_slots_needed(int(lens.max()), max_new_tokens, K)
        if need > self.layout.cache_len:
            raise InputError(f"speculative decoding of {max_new_tokens} tokens after a prompt of "
                             f"{int(lens.max())} with K = {K} needs {need} cache slots; the graphs have "
                             f"{self.layout.cache_len} (export with a larger --max-cache-len)")
        accepted, verified = np.zeros(B, np.int64), np.zeros(B, np.int64)
        if max_new_tokens == 0:
            return SpecResult(prompts, np.zeros((B, 0), np.int64), accepted, verified, 0, K)
        states = {n: self.verify.zeros(n, B) for n in self.state_names}
        cache = {n: self.mtp.zeros(n, B) for n in self.mtp_state_names}
        hidden, first = self._prefill(prompts, lens, states, cache)
        generated = np.zeros((B, max_new_tokens + K + 1), np.int64)
        generated[:, 0] = first
        emitted, past, pending = np.ones(B, np.int64), lens.copy(), first.copy()
        # the head's next input: `count` positions from `mtp_past` on, tokens and the model's hidden states
        catch_tokens = np.zeros((B, K + 1), np.int64)
        catch_hidden = np.zeros((B, K + 1, hidden.shape[-1]), np.float32)
        catch_tokens[:, 0], catch_hidden[:, 0] = first, hidden
        count, mtp_past = np.ones(B, np.int64), lens - 1
        rounds = 0
        while (emitted < max_new_tokens).any():
            act = (emitted < max_new_tokens).astype(np.int64)
            drafts, q = self._drafts(catch_tokens, catch_hidden, mtp_past, count * act, past, act, cache)
            out = self.verify.run({"input_ids": np.concatenate((pending[:, None], drafts), 1),
                                   "past_lengths": past, "seq_lens": (K + 1) * act, **states})
            logits = out["logits"]
            acc, token = self._accept(logits, drafts, q)
            kept = (acc + 1) * act
            self._roll_back(states, out, kept)
            row_out = np.concatenate((drafts, drafts[:, :1]), 1)
            row_out[np.arange(B), acc] = token
            for b in np.flatnonzero(act):
                generated[b, emitted[b]:emitted[b] + kept[b]] = row_out[b, :kept[b]]
            live = act.astype(bool)
            catch_tokens[live] = row_out[live]
            catch_hidden[live] = out["hidden"][live]
            count[live], mtp_past[live], pending[live] = acc[live] + 1, past[live], token[live]
            past += kept
            emitted += kept
            accepted += acc * act
            verified += act
            rounds += 1
        return SpecResult(prompts, generated[:, :max_new_tokens], accepted, verified, rounds, K)

    # ------------------------------------------------------------------ steps
    def _prefill(self, prompts, lens: np.ndarray, states: dict, cache: dict):
        """The verify graph over the prompts in windows of K + 1 tokens, then the head over positions
        0 .. n-2. Returns (the hidden state at each row's last prompt position [B, H], the first
        token of each row [B])."""
        B, width = len(prompts), self.k + 1
        longest = int(lens.max())
        hidden, last_hidden, last_logits = None, None, None
        past = np.zeros(B, np.int64)
        while (past < lens).any():
            seq = np.minimum(lens - past, width)
            ids = pad_rows([p[o:o + width] for p, o in zip(prompts, past)], width)
            out = self.verify.run({"input_ids": ids, "past_lengths": past, "seq_lens": seq, **states})
            h = out["hidden"].astype(np.float32)
            if hidden is None:
                hidden = np.zeros((B, longest, h.shape[-1]), np.float32)
                last_hidden = np.zeros((B, h.shape[-1]), np.float32)
                last_logits = np.zeros((B, out["logits"].shape[-1]), np.float32)
            for b in np.flatnonzero(seq):
                hidden[b, past[b]:past[b] + seq[b]] = h[b, :seq[b]]
                if past[b] + seq[b] == lens[b]:
                    last_hidden[b], last_logits[b] = h[b, seq[b] - 1], out["logits"][b, seq[b] - 1]
            self._roll_back(states, out, seq)
            past += seq
        first = self._pick(last_logits)
        head_lens = lens - 1
        done = np.zeros(B, np.int64)
        chunk = max(width, 256)
        while (done < head_lens).any():
            size = int(min(chunk, (head_lens - done).max()))
            seq = np.minimum(head_lens - done, size)
            tok = pad_rows([p[1 + o:1 + o + size] for p, o in zip(prompts, done)], size)
            hid = np.zeros((B, size, hidden.shape[-1]), np.float32)
            for b in np.flatnonzero(seq):
                hid[b, :seq[b]] = hidden[b, done[b]:done[b] + seq[b]]
            self._head(tok, hid, done, seq, cache)
            done += seq
        return last_hidden, first

    def _head(self, tokens, hidden, past, seq, cache: dict):
        """One call of the head; its cache updated. Returns (logits [B, V], mtp_hidden [B, 1, H])."""
        out = self.mtp.run({"input_ids": tokens, "hidden": hidden, "past_lengths": past, "seq_lens": seq, **cache})
        for name in cache:
            cache[name] = out["present" + name[len("past"):]]
        return out["logits"][:, -1].astype(np.float32), out["mtp_hidden"]

    def _drafts(self, catch_tokens, catch_hidden, mtp_past, counts, past, act, cache):
        """K drafts a row [B, K] (and their distributions [B, K, V] when sampling, else None): one
        call over the catch-up positions, then K - 1 one-token calls fed the head's own hidden state."""
        drafts, qs = [], []
        logits, y = self._head(catch_tokens, catch_hidden, mtp_past, counts, cache)
        for j in range(self.k):
            d, q = self._draft_pick(logits)
            drafts.append(d)
            qs.append(q)
            if j + 1 < self.k:
                logits, y = self._head(d[:, None], y, past + j, act, cache)
        return np.stack(drafts, 1), (np.stack(qs, 1) if self.temperature > 0 else None)

    def _roll_back(self, states: dict, out: dict, kept: np.ndarray) -> None:
        """Each row's states after its first kept[b] tokens of the call (kept 0: as they were)."""
        rows = np.arange(len(kept))
        for name in states:
            layer = name[len("past"):]
            if name.endswith(".conv"):
                window = out[f"present{layer}_window"]  # [B, C, W-1+K+1]
                cols = kept[:, None] + np.arange(window.shape[-1] - self.k - 1)
                states[name] = np.take_along_axis(window, cols[:, None, :], 2)
            elif name.endswith(".recurrent"):
                steps = out[f"present{layer}_steps"]  # [B, K+1, Hv, Dk, Dv]
                states[name] = steps[rows, np.maximum(kept - 1, 0)]
            else:
                states[name] = out["present" + layer]

    def _pick(self, logits: np.ndarray) -> np.ndarray:
        if self.temperature == 0:
            return logits.argmax(-1)
        import torch

        from gdn_export.runtime.speculative import _sample

        p = torch.softmax(torch.from_numpy(logits).double() / self.temperature, -1)
        return _sample(p, self.generator).numpy()

    def _draft_pick(self, logits: np.ndarray):
        if self.temperature == 0:
            return logits.argmax(-1), None
        import torch

        from gdn_export.runtime.speculative import _sample

        q = torch.softmax(torch.from_numpy(logits).double() / self.temperature, -1)
        return _sample(q, self.generator).numpy(), q.numpy()

    def _accept(self, logits: np.ndarray, drafts: np.ndarray, q):
        """(accepted drafts [B], the model's token after them [B]) from the verify logits [B, K+1, V]."""
        K = self.k
        if self.temperature == 0:
            target = logits.argmax(-1)
            accepted = (drafts == target[:, :K]).cumprod(1).sum(1)
            return accepted, target[np.arange(len(drafts)), accepted]
        import torch

        from gdn_export.runtime.speculative import _sample, rejection_accept

        p = torch.softmax(torch.from_numpy(logits).double() / self.temperature, -1)
        u = torch.rand(drafts.shape, generator=self.generator, dtype=torch.float64)
        acc, token = rejection_accept(p, torch.from_numpy(q), torch.from_numpy(drafts), u,
                                      lambda dist: _sample(dist, self.generator))
        return acc.numpy(), token.numpy()
