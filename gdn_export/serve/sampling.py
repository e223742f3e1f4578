"""What a request asks of the generation (`SamplingParams`) and how the next tokens are picked.

Greedy (temperature 0, or top_k 1) is the argmax of the logits, exactly what `gdn-export run` picks.
Otherwise the logits are divided by the temperature, cut to the top_k largest and to the smallest
set whose probability reaches top_p (the most probable token always stays), and one token is drawn
from the softmax by the exponential race: argmax(p / E) with E ~ Exp(1) drawn per vocabulary entry,
which picks token i with probability p_i. A request with a seed draws its E from its own generator,
so its tokens depend on the seed, the prompt and the parameters only, not on what else is in the
batch; requests without one share the engine's generator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from gdn_export.serve.transfer import to_device


@dataclass(frozen=True)
class SamplingParams:
    """max_tokens >= 1 new tokens at most; temperature >= 0 (0: greedy); 0 < top_p <= 1;
    top_k >= 0 (0: off); seed (None: the engine's generator); stop_token_ids end the generation
    (as does an end-of-sequence id of the checkpoint unless ignore_eos). The token that stops is
    counted in the usage but gives no text."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def pick_tokens(logits: torch.Tensor, params: Sequence[SamplingParams],
                generators: Sequence[torch.Generator | None], shared: torch.Generator,
                greedy: torch.Tensor | None = None) -> torch.Tensor:
    """The next token of each row: logits [n, V] fp32 on the device, one SamplingParams and one
    generator (None: `shared`) per row; greedy [n] int64: the argmax when the caller has it
    (the CUDA graph picks it). Returns [n] int64 on the device."""
    picked = logits.argmax(-1) if greedy is None else greedy.clone()
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        index = to_device(rows, logits.device)
        drawn = sample(logits.index_select(0, index), [params[i] for i in rows],
                       [generators[i] for i in rows], shared)
        picked.index_copy_(0, index, drawn)
    return picked


def sample(logits: torch.Tensor, params: Sequence[SamplingParams],
           generators: Sequence[torch.Generator | None], shared: torch.Generator) -> torch.Tensor:
    """One token per row drawn as the module docstring says: logits [k, V] fp32, params and
    generators per row (none greedy). Returns [k] int64 on the logits' device."""
    return draw(probabilities(logits, params), generators, shared)


def probabilities(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """The distribution each row samples from (module docstring): logits [k, V] fp32 divided by the
    temperature, cut to top_k and top_p, softmaxed; params per row (none greedy). Returns [k, V]."""
    k, vocab = logits.shape
    dev = logits.device
    # (parameters through pinned memory, branches decided on the host: nothing here waits for the device)
    temperature = to_device([p.temperature for p in params], dev, torch.float32)
    x = logits / temperature[:, None]
    top_k = [min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params]
    if min(top_k) < vocab:
        values = x.topk(max(top_k), dim=-1).values  # [k, max(top_k)], descending
        kth = values.gather(1, to_device(top_k, dev)[:, None] - 1)
        x = x.masked_fill(x < kth, float("-inf"))
    if any(p.top_p < 1 for p in params):
        top_p = to_device([p.top_p for p in params], dev, torch.float32)
        ordered, order = x.sort(dim=-1, descending=True)
        probs = ordered.softmax(-1)
        # Drop a token when the more probable ones already reach top_p; the first always stays.
        drop = (probs.cumsum(-1) - probs) >= top_p[:, None]
        drop[:, 0] = False
        x = x.scatter(1, order, ordered.masked_fill(drop, float("-inf")))
    return x.softmax(-1)


def draw(probs: torch.Tensor, generators: Sequence[torch.Generator | None], shared: torch.Generator) -> torch.Tensor:
    """One token per row of probs [k, V] (rows sum to 1) by the exponential race, row i's draws from
    generators[i] (None: `shared`). Returns [k] int64."""
    race = torch.empty_like(probs).exponential_(generator=shared)
    for i, gen in enumerate(generators):
        if gen is not None:
            race[i].exponential_(generator=gen)
    race.clamp_(min=1e-30)  # a draw of exactly 0 would turn p = 0 into 0 / 0
    return (probs / race).argmax(-1)


def uniforms(shape: tuple[int, ...], generators: Sequence[torch.Generator | None], shared: torch.Generator,
             device: torch.device) -> torch.Tensor:
    """Uniform [0, 1) draws [k, ...] (k = len(generators)), row i's from generators[i] (None: `shared`)."""
    u = torch.rand(shape, generator=shared, device=device)
    for i, gen in enumerate(generators):
        if gen is not None:
            u[i] = torch.rand(shape[1:], generator=gen, device=device)
    return u
