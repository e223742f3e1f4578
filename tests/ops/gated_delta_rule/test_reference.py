"""The two fp32 references of the gated delta rule agree with each other and with a float64 loop."""

import pytest
import torch

from gdn_export.ops import gated_delta_rule, use_backend
from gdn_export.ops.gated_delta_rule.naive import chunked_gated_delta_rule, recurrent_gated_delta_rule
from tests.conftest import gdn_inputs

SHAPES = [
    # B, T, Hk, Hv, Dk, Dv
    pytest.param(1, 1, 1, 1, 8, 8, id="decode-T1"),
    pytest.param(2, 63, 2, 4, 16, 24, id="T63-Hv2Hk-DkneDv"),
    pytest.param(3, 65, 2, 2, 16, 16, id="T65-B3"),
    pytest.param(2, 130, 1, 3, 8, 12, id="T130-Hv3Hk"),
]


def _loop_float64(q, k, v, g, beta, s0, scale):
    """A third, deliberately literal reading of S_t = a S (I - b k k^T) + b k v^T (state [Dk, Dv])."""
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2:]
    S = s0.double().clone()
    o = torch.zeros(B, T, Hv, Dv, dtype=torch.float64)
    for b in range(B):
        for h in range(Hv):
            hk = h // (Hv // Hk)
            for t in range(T):
                kt = k[b, t, hk].double() / (k[b, t, hk].double().square().sum() + 1e-6).sqrt()
                qt = q[b, t, hk].double() / (q[b, t, hk].double().square().sum() + 1e-6).sqrt()
                a, bt = g[b, t, h].double().exp(), beta[b, t, h].double()
                I = torch.eye(Dk, dtype=torch.float64)
                S[b, h] = a * (I - bt * torch.outer(kt, kt)) @ S[b, h] + bt * torch.outer(kt, v[b, t, h].double())
                o[b, t, h] = scale * S[b, h].T @ qt
    return o, S


@pytest.mark.parametrize("B,T,Hk,Hv,Dk,Dv", SHAPES)
def test_recurrent_and_chunked_agree_with_literal_loop(B, T, Hk, Hv, Dk, Dv):
    x = gdn_inputs(B, T, Hk, Hv, Dk, Dv)
    scale = Dk**-0.5
    o_ref, s_ref = _loop_float64(x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], scale)
    for fn in (recurrent_gated_delta_rule, chunked_gated_delta_rule):
        o, s = fn(**x, scale=scale, use_qk_l2norm=True)
        assert s.dtype == torch.float32
        torch.testing.assert_close(o.double(), o_ref, atol=2e-5, rtol=1e-4, msg=fn.__name__)
        torch.testing.assert_close(s.double(), s_ref, atol=2e-5, rtol=1e-4, msg=fn.__name__)


@pytest.mark.parametrize("chunk_size", [16, 64], ids=lambda c: f"chunk{c}")
def test_chunked_matches_recurrent_without_norm(chunk_size):
    x = gdn_inputs(2, 100, 2, 4, 16, 8)
    x["q"], x["k"] = (torch.nn.functional.normalize(t, dim=-1) for t in (x["q"], x["k"]))
    o1, s1 = recurrent_gated_delta_rule(**x)
    o2, s2 = chunked_gated_delta_rule(**x, chunk_size=chunk_size)
    torch.testing.assert_close(o2, o1, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(s2, s1, atol=1e-5, rtol=1e-4)


def test_varlen_equals_per_sequence_loop():
    x = gdn_inputs(1, 90, 2, 4, 8, 8, state=False)
    cu = torch.tensor([0, 1, 40, 90])
    s0 = torch.randn(3, 4, 8, 8)
    o, s = chunked_gated_delta_rule(**{**x, "initial_state": s0}, use_qk_l2norm=True, cu_seqlens=cu)
    for n, (a, b) in enumerate([(0, 1), (1, 40), (40, 90)]):
        part = {key: val[:, a:b] for key, val in x.items() if val is not None}
        o_n, s_n = recurrent_gated_delta_rule(**part, initial_state=s0[n : n + 1], use_qk_l2norm=True)
        torch.testing.assert_close(o[:, a:b], o_n, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(s[n : n + 1], s_n, atol=1e-5, rtol=1e-4)


def test_prefill_then_decode_equals_one_pass():
    x = gdn_inputs(2, 20, 1, 2, 8, 8)
    o_all, s_all = gated_delta_rule(**x, use_qk_l2norm=True)
    head = {key: (val[:, :19] if key != "initial_state" else val) for key, val in x.items()}
    tail = {key: val[:, 19:] for key, val in x.items() if key != "initial_state"}
    o1, s1 = gated_delta_rule(**head, use_qk_l2norm=True)
    o2, s2 = gated_delta_rule(**tail, initial_state=s1, use_qk_l2norm=True)
    torch.testing.assert_close(torch.cat([o1, o2], 1), o_all, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(s2, s_all, atol=1e-5, rtol=1e-4)


def test_op_output_dtype_follows_v_and_state_is_fp32():
    x = gdn_inputs(1, 5, 1, 1, 8, 8, dtype=torch.bfloat16)
    o, s = gated_delta_rule(**x)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda x: x.update(v=x["v"][:, :, :3]), "multiple of key heads"),
        (lambda x: x.update(g=x["g"][:, :-1]), "g must be"),
        (lambda x: x.update(initial_state=x["initial_state"][:, :, :-1]), "initial_state must be"),
        (lambda x: x.update(k=x["k"][..., :-1]), "q and k"),
    ],
    ids=["Hv-not-multiple", "g-shape", "state-shape", "k-shape"],
)
def test_bad_shapes_raise_named_errors(change, match):
    x = gdn_inputs(1, 4, 2, 4, 8, 8)
    change(x)
    with pytest.raises(ValueError, match=match):
        gated_delta_rule(**x)


def test_unknown_backend_is_a_clear_error():
    from gdn_export.errors import GdnExportError

    with pytest.raises(GdnExportError, match="unknown gdn backend 'nope'"):
        with use_backend("nope"):
            pass
