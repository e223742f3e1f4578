"""gdn::gated_delta_rule_steps (every token's state, for the verify step of speculative decoding):
the reference, the Triton fused recurrent kernel's every-step output (under TRITON_INTERPRET=1 on
a CPU-only machine), the CUDA recurrent kernel's stepStates output (on a GPU) and the token-by-token
form of backends without one, against T one-token calls of the reference op; padded (identity)
tokens keep the state."""

import pytest
import torch

from gdn_export.ops import use_backend
from gdn_export.ops.gated_delta_rule.naive import (recurrent_gated_delta_rule,
                                                   recurrent_gated_delta_rule_steps)
from gdn_export.ops.gated_delta_rule.steps import gated_delta_rule_steps, token_by_token
from tests.conftest import assert_close_rms, gdn_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
STATES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _inputs(T, dtype=torch.float32, state="fp32", seed=0, Dk=16, Dv=24, B=2):
    x = gdn_inputs(B, T, 2, 4, Dk, Dv, dtype=dtype, seed=seed, correlated=True)
    x["initial_state"] = x["initial_state"].to(STATES[state])
    return {k: v.to(DEVICE) for k, v in x.items()}


def _one_by_one(x):
    """T calls of the reference op of one token each: (o [B, T, Hv, Dv], states [B, T, Hv, Dk, Dv])."""
    state, outs, states = x["initial_state"], [], []
    for t in range(x["q"].shape[1]):
        piece = {k: x[k][:, t:t + 1] for k in ("q", "k", "v", "g", "beta")}
        o, state = recurrent_gated_delta_rule(**piece, initial_state=state, use_qk_l2norm=True)
        outs.append(o)
        states.append(state)
    return torch.cat(outs, 1), torch.stack(states, 1)


@pytest.mark.parametrize("state", list(STATES))
def test_reference_is_one_token_calls(state):
    """Bit for bit: each token's state is stored rounded and the next starts from it."""
    x = _inputs(5, state=state)
    o, states = recurrent_gated_delta_rule_steps(**x, use_qk_l2norm=True)
    want_o, want_states = _one_by_one(x)
    assert states.dtype == STATES[state] and states.shape == (2, 5, 4, 16, 24)
    assert torch.equal(o, want_o) and torch.equal(states, want_states)
    if state == "fp32":  # and the last is the whole call's final state
        _, final = recurrent_gated_delta_rule(**x, use_qk_l2norm=True)
        assert_close_rms(states[:, -1], final, torch.float32, "final state")


IMPLS = ["reference", "triton", "token-by-token"] + (
    [pytest.param("cuda", marks=pytest.mark.gpu)] if torch.cuda.is_available() else [])
# (dtype, state, T, Dk, Dv, B): verify calls of K + 1 tokens, one token, T past the recurrent
# kernel's default range (every T runs it), head dims off the kernels' tiles (odd Dv: scalar columns)
CASES = {
    "fp32-T5": (torch.float32, "fp32", 5, 16, 24, 2),
    "bf16-T4": (torch.bfloat16, "bf16", 4, 16, 24, 2),
    "fp16-state-T1": (torch.float32, "fp16", 1, 16, 24, 2),
    "fp16-T17-Dk48-Dv20": (torch.float16, "fp32", 17, 48, 20, 3),
    "bf16-state-T3-Dk128-Dv40": (torch.bfloat16, "bf16", 3, 128, 40, 1),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", list(CASES))
def test_every_backend_matches_one_token_calls(impl, case):
    dtype, state, T, Dk, Dv, B = CASES[case]
    x = _inputs(T, dtype=dtype, state=state, seed=T, Dk=Dk, Dv=Dv, B=B)
    want_o, want_states = _one_by_one(x)
    o_ref = torch.full_like(want_o, float("nan"))
    if impl == "token-by-token":
        with use_backend("reference"):
            o, states = token_by_token(**x, scale=Dk ** -0.5, use_qk_l2norm=True)
    else:
        with use_backend(impl):
            o, states = gated_delta_rule_steps(**x, use_qk_l2norm=True)
    assert o.dtype == dtype and states.dtype == STATES[state] and states.shape == want_states.shape
    o_ref.copy_(o)
    assert_close_rms(o_ref, want_o, dtype, "o")
    for t in range(T):
        assert_close_rms(states[:, t].float(), want_states[:, t].float(), STATES[state], f"state {t}")


@pytest.mark.parametrize("impl", [i for i in IMPLS if i != "token-by-token"])
def test_padded_tokens_keep_the_state(impl):
    """Rows of a ragged verify call: g = 0, beta = 0 past a row's end leaves its state as it is."""
    x = _inputs(4, seed=3)
    x["g"][1, 2:] = 0
    x["beta"][1, 2:] = 0
    with use_backend(impl):
        _, states = gated_delta_rule_steps(**x, use_qk_l2norm=True)
    assert torch.equal(states[1, 2], states[1, 1]) and torch.equal(states[1, 3], states[1, 1])


def test_no_initial_state_is_zeros():
    x = _inputs(3)
    x["initial_state"] = None
    with use_backend("reference"):
        o, states = gated_delta_rule_steps(**x, use_qk_l2norm=True)
    x["initial_state"] = torch.zeros(2, 4, 16, 24, device=DEVICE)
    want_o, want_states = _one_by_one(x)
    assert states.dtype == torch.float32 and torch.equal(states, want_states) and torch.equal(o, want_o)
