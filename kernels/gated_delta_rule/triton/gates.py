"""Gated delta rule from the raw gate projections, with the gates computed inside the kernels.

The Gated DeltaNet layer (Qwen3-Next / Qwen3.5) turns projections a, b into

    g    = -exp(A_log) * softplus(a + dt_bias)     (log decay, fp32)
    beta = sigmoid(b)

Fusing that into the kernels saves two [B, T, Hv] round trips through memory per layer.
"""

from __future__ import annotations

import torch

from kernels.gated_delta_rule.triton.chunk import chunk_gated_delta_rule
from kernels.gated_delta_rule.triton.fused_recurrent import fused_recurrent_gated_delta_rule

# Prompts at most this long run token by token (one kernel, no intermediates).
RECURRENT_MAX_T = 16


def gated_delta_rule_from_gates(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    cu_seqlens: torch.Tensor | None = None,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated delta rule with g and beta computed in the kernels.

    Args:
        q, k: [B, T, Hk, Dk]. v: [B, T, Hv, Dv]. a, b: [B, T, Hv] (any float dtype).
        A_log, dt_bias: [Hv]. initial_state: [N, Hv, Dk, Dv] fp32, fp16 or bf16 (storage), or None.
        cu_seqlens: [N + 1] or None. inplace: (recurrent path only, T <= 16) update
            initial_state in place.
    Returns:
        o [B, T, Hv, Dv] in v's dtype, final_state [N, Hv, Dk, Dv] in initial_state's dtype (fp32 for None).
    """
    Hv = v.shape[2]
    for name, t in (("a", a), ("b", b)):
        if tuple(t.shape) != tuple(v.shape[:3]):
            raise ValueError(f"{name} must be [B, T, Hv] = {tuple(v.shape[:3])}, got {tuple(t.shape)}")
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        if tuple(t.shape) != (Hv,):
            raise ValueError(f"{name} must be [Hv] = ({Hv},), got {tuple(t.shape)}")
    gates = (a, b, A_log.float(), dt_bias.float())
    if v.shape[1] <= RECURRENT_MAX_T and cu_seqlens is None:
        return fused_recurrent_gated_delta_rule(q, k, v, None, None, initial_state, scale,
                                                use_qk_l2norm, None, inplace=inplace, gates=gates)
    if inplace:
        raise ValueError(f"inplace is for the recurrent path (T <= {RECURRENT_MAX_T}), got T={v.shape[1]}")
    return chunk_gated_delta_rule(q, k, v, None, None, initial_state, scale, use_qk_l2norm,
                                  cu_seqlens, gates=gates)
