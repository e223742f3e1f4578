"""Triton MoE routing against the reference's, on CPU under TRITON_INTERPRET=1 (the output at every
size and dtype: tests/ops/moe)."""

from __future__ import annotations

import pytest
import torch

from gdn_export.ops.moe.naive import route
from kernels.moe.triton.moe import moe as triton_moe
from tests.ops.moe.inputs import moe_inputs

CASES = {  # (N, H, E, I, top_k, norm)
    "N1-E4-k1": (1, 16, 4, 16, 1, True),
    "N7-E8-k2-I24-nonorm": (7, 32, 8, 24, 2, False),
    "N65-E16-k4-I20": (65, 16, 16, 20, 4, True),
    "N7-E5-k3-H40": (7, 40, 5, 16, 3, True),
    "N300-E12-k4-prefill_tiles": (300, 24, 12, 20, 4, True),  # 1200 pairs: the 64-row prefill tiles
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_triton_routing_matches_reference(case):
    """The routing kernel's expert ids and weights (the output's numerics: tests/ops/moe)."""
    N, H, E, I, k, norm = case
    hidden, logits, gate_up, down = moe_inputs(N, H, E, I, torch.float32, seed=N + E)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter without a GPU
    _, ids, weights = triton_moe(*(t.to(device) for t in (hidden, logits, gate_up, down)), k, norm,
                                 return_routing=True)
    ref_ids, ref_w = route(logits, k, norm)
    torch.testing.assert_close(ids.long().cpu(), ref_ids)
    torch.testing.assert_close(weights.cpu(), ref_w, atol=1e-6, rtol=1e-5)
