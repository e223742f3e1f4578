"""`gdn::gated_delta_rule_steps`: the gated delta rule keeping the state after every token, for the
verify step of speculative decoding (gdn_export.models.verify), where each row keeps only the
state after its accepted tokens.

    inputs: q, k, v, g, beta, initial_state, scale, use_qk_l2norm as gdn::gated_delta_rule
    (gdn_export.ops.gated_delta_rule; no cu_seqlens: rows are right-padded, padded tokens are the
    exact identity step g = 0, beta = 0)

    outputs  0 o       [B, T, Hv, Dv]      T
             1 states  [B, T, Hv, Dk, Dv]  S    states[:, t] = the state after token t

S is initial_state's storage dtype (fp32 for None). Each token's state is rounded to S where it is
stored, and the next token starts from the stored value: the numbers of T calls of one token each
(the op's rounding rule, token by token), so a row that keeps its first t + 1 tokens holds the
state that decoding them one by one would give. states[:, -1] is the final state.

Implementations: the reference (`naive.recurrent_gated_delta_rule_steps`), the Triton fused
recurrent kernel (its optional every-step output, kernels/gated_delta_rule/triton/fused_recurrent.py),
the CUDA recurrent kernel (its stepStates output, kernels/gated_delta_rule/cuda/), and, for a
backend without one, T calls of the backend's gated_delta_rule of one token each (`token_by_token`).
Exported, the op is one `gdn.GatedDeltaRuleSteps` node (onnx_steps.py), which the TensorRT
plugin of that name runs (plugins/gatedDeltaRulePlugin) and ONNX Runtime through its function body.
"""

from __future__ import annotations

import torch

from gdn_export.ops import backends
from gdn_export.ops.gated_delta_rule import check_inputs, gated_delta_rule, state_storage_dtype

OP_NAME = "gdn::gated_delta_rule_steps"


@torch.library.custom_op(OP_NAME, mutates_args=())
def _steps_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              initial_state: torch.Tensor | None, scale: float,
              use_qk_l2norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _run(q, k, v, g, beta, initial_state, scale, use_qk_l2norm)


@_steps_op.register_fake
def _(q, k, v, g, beta, initial_state, scale, use_qk_l2norm):
    B, T, _, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    return v.new_empty(B, T, Hv, Dv), v.new_empty(B, T, Hv, Dk, Dv, dtype=state_storage_dtype(initial_state))


def _run(q, k, v, g, beta, initial_state, scale, use_qk_l2norm):
    backend = backends.for_device(v.device)
    if backend.gated_delta_rule_steps is not None:
        o, states = backend.gated_delta_rule_steps(q, k, v, g, beta, initial_state, scale, use_qk_l2norm)
        return o.to(v.dtype).contiguous(), states.contiguous()
    return token_by_token(q, k, v, g, beta, initial_state, scale, use_qk_l2norm)


def token_by_token(q, k, v, g, beta, initial_state, scale, use_qk_l2norm):
    """T calls of gated_delta_rule with one token each (the active backend's, or the traced op's):
    (o [B, T, Hv, Dv], states [B, T, Hv, Dk, Dv])."""
    if initial_state is None:
        B, _, _, Dk = q.shape
        initial_state = v.new_zeros(B, v.shape[2], Dk, v.shape[3], dtype=torch.float32)
    state, outs, states = initial_state, [], []
    for t in range(q.shape[1]):
        o, state = gated_delta_rule(*(x[:, t:t + 1].contiguous() for x in (q, k, v, g, beta)),
                                    initial_state=state, scale=scale, use_qk_l2norm=use_qk_l2norm)
        outs.append(o)
        states.append(state)
    return torch.cat(outs, dim=1), torch.stack(states, dim=1)


def gated_delta_rule_steps(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule with every token's state (module docstring): q, k [B, T, Hk, Dk],
    v [B, T, Hv, Dv], g, beta [B, T, Hv], initial_state [B, Hv, Dk, Dv] or None.
    Returns o [B, T, Hv, Dv] in v's dtype and states [B, T, Hv, Dk, Dv] in the state's dtype."""
    check_inputs(q, k, v, g, beta, initial_state, None)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if backends.exporting():
        return torch.ops.gdn.gated_delta_rule_steps(q, k, v, g, beta, initial_state, scale, bool(use_qk_l2norm))
    if backends.can_call_directly(q, k, v, g, beta, initial_state):
        return _run(q, k, v, g, beta, initial_state, scale, bool(use_qk_l2norm))
    return torch.ops.gdn.gated_delta_rule_steps(q, k, v, g, beta, initial_state, scale, bool(use_qk_l2norm))
