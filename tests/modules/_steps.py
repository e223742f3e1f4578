"""StepInputs for module tests: what HybridForCausalLM.forward builds once per call."""

from __future__ import annotations

import torch

from gdn_export.layout import DeployLayout
from gdn_export.modules.kv_cache import make_step
from gdn_export.modules.rotary import RotaryEmbedding

CONCAT = DeployLayout.make(kv_cache="concat")


def step(batch: int, seq: int, past=0, lens=None, layout: DeployLayout = CONCAT, rope=None,
         dtype=torch.float32):
    """StepInputs for `seq` tokens per row at `past` (int or list), real lengths `lens` (default seq)."""
    past = torch.as_tensor(past if isinstance(past, list) else [past] * batch)
    lens = torch.as_tensor(lens if lens is not None else [seq] * batch)
    rope = rope or RotaryEmbedding(4, 10000.0)
    return make_step(past, lens, seq, rope, dtype, layout)
