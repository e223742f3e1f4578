"""Right-padded (ragged) batches for every backend's tests: lengths, inputs, and the check that a
padded batch equals each row run alone.

Conv: rows of lengths L_b in a [B, T] batch; y must match on t < L_b and be finite elsewhere, the
new state must equal the row's own (a copy of inputs, so exactly in every dtype).
Gated delta rule: padding is g = 0 and beta = 0 past each row's end, which must leave the state
unchanged.
"""

from __future__ import annotations

import torch

from gdn_export.ops.causal_conv1d.naive import causal_conv1d as conv_reference
from tests.conftest import assert_close_rms

# name -> (T, lengths); the ids say what each covers.
CONV_RAGGED = {
    "T1-decode-some-empty": (1, [1, 0, 1, 0]),
    "T2-shorter-than-state": (2, [2, 1, 0]),
    "T63-mixed": (63, [63, 0, 17, 1]),
    "T130-mixed": (130, [1, 63, 130]),
    "T65-all-empty": (65, [0, 0]),
    "T65-all-full": (65, [65, 65]),
}


def conv_ragged_inputs(lengths, T, C, K, dtype, device, bias=True, state=True, seed=0):
    """x [B, T, C] whose padded positions hold large values (they must never reach the state),
    weight [C, K], bias [C], conv_state [B, C, K-1] and seq_lens [B] int32."""
    gen = torch.Generator().manual_seed(seed)
    B = len(lengths)
    x = torch.randn(B, T, C, generator=gen)
    lens = torch.tensor(lengths, dtype=torch.int32)
    pad = torch.arange(T)[None, :] >= lens[:, None]
    x[pad] = 10.0 * torch.randn(int(pad.sum()), C, generator=gen)
    w = 0.5 * torch.randn(C, K, generator=gen)
    b = 0.1 * torch.randn(C, generator=gen) if bias else None
    s0 = torch.randn(B, C, K - 1, generator=gen) if state else None
    cast = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
    return cast(x), cast(w), cast(b), cast(s0), lens.to(device)


def check_conv_rows(y, new_state, x, w, b, s0, lens, silu, dtype, exact=False):
    """y [B, T, C] and new_state [B, C, K-1] of a ragged call against each row run alone through the
    fp32 reference: y on the real tokens within the dtype's bound (exact=True: 1e-6), y finite at
    padded positions, the state bit-identical."""
    B, T, C = x.shape
    K = w.shape[1]
    cpu = lambda t: None if t is None else t.detach().cpu()  # noqa: E731
    x, w, b, s0, y, new_state = map(cpu, (x, w, b, s0, y, new_state))
    assert torch.isfinite(y.float()).all(), "y has a NaN or Inf (padded positions must stay finite)"
    ys, yr = [], []
    for i, L in enumerate(lens.tolist()):
        s_row = torch.zeros(1, C, K - 1, dtype=x.dtype) if s0 is None else s0[i : i + 1]
        if L == 0:
            want = s_row  # no tokens: the row's state is unchanged
        else:
            f32 = lambda t: None if t is None else t.float()  # noqa: E731
            y_row, want = conv_reference(x[i : i + 1, :L].float(), w.float(), f32(b), s_row.float(), silu)
            ys.append(y[i, :L].float())
            yr.append(y_row[0].float())
        assert torch.equal(new_state[i : i + 1], want.to(new_state.dtype)), f"state of row {i} (L={L})"
    if ys:
        got, ref = torch.cat(ys), torch.cat(yr)
        if exact:
            torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
        else:
            assert_close_rms(got, ref, dtype, "y on real tokens")


# ------------------------------------------------------------------------------- gated delta rule

# Rows of lengths 1, 63 and 130 in a T = 130 batch (the brief's shape), Hv = 2 Hk, Dk != Dv.
GDR_PADDED = dict(lengths=(1, 63, 130), T=130, Hk=1, Hv=2, Dk=16, Dv=32)


def gdr_padded_inputs(lengths, T, Hk, Hv, Dk, Dv, dtype, device, correlated=False, seed=0):
    """gdn_inputs for len(lengths) right-padded rows: g = 0 and beta = 0 at t >= L_b (what a model
    writes at padded positions), random q / k / v everywhere."""
    from tests.conftest import gdn_inputs

    x = gdn_inputs(len(lengths), T, Hk, Hv, Dk, Dv, dtype=dtype, device=device, seed=seed, correlated=correlated)
    pad = (torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]).to(device)
    x["g"] = x["g"].masked_fill(pad[..., None], 0.0)
    x["beta"] = x["beta"].masked_fill(pad[..., None], 0.0)
    return x


def gdr_rows_alone(x, lengths, reference):
    """Each row b of x run alone on its first L_b tokens through `reference` (a naive form):
    [(o_b [L_b, Hv, Dv] | None, state_b [1, Hv, Dk, Dv])]."""
    out = []
    for b, L in enumerate(lengths):
        s0 = x["initial_state"][b : b + 1].cpu().float()
        if L == 0:
            out.append((None, s0))
            continue
        row = {n: x[n][b : b + 1, :L].cpu() for n in ("q", "k", "v", "g", "beta")}
        o, s = reference(**row, initial_state=s0, scale=x["q"].shape[-1] ** -0.5, use_qk_l2norm=True)
        out.append((o[0], s))
    return out


def check_gdr_rows(o, state, x, lengths, dtype, reference, exact=False):
    """o [B, T, Hv, Dv] and state [B, Hv, Dk, Dv] of a padded batch against each row alone: exact=True
    (the reference itself) at 1e-6, otherwise within the dtype's relative-RMS bound."""
    o, state = o.detach().cpu(), state.detach().cpu()
    assert torch.isfinite(o.float()).all() and torch.isfinite(state).all()
    got_o, ref_o = [], []
    for b, (o_row, s_row) in enumerate(gdr_rows_alone(x, lengths, reference)):
        if exact:
            torch.testing.assert_close(state[b : b + 1], s_row, rtol=1e-6, atol=1e-6, msg=f"state of row {b}")
        else:
            assert_close_rms(state[b : b + 1], s_row, dtype, f"state of row {b}")
        if o_row is not None:
            got_o.append(o[b, : lengths[b]].float())
            ref_o.append(o_row.float())
    got_o, ref_o = torch.cat(got_o), torch.cat(ref_o)
    if exact:
        torch.testing.assert_close(got_o, ref_o, rtol=1e-5, atol=1e-6)
    else:
        assert_close_rms(got_o, ref_o, dtype, "o on real tokens")


def pack(x):
    """The rows of x as one cu_seqlens pack: (x with B = 1, cu_seqlens [B + 1] int32)."""
    B, T = x["q"].shape[:2]
    packed = {n: x[n].reshape(1, B * T, *x[n].shape[2:]) for n in ("q", "k", "v", "g", "beta")}
    packed["initial_state"] = x["initial_state"]
    cu = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=x["q"].device)
    return packed, cu


def with_beta_up_to_2(x):
    """beta doubled: (0, 2), OLMo-Hybrid's allow_neg_eigval range (eigenvalues of I - beta k k^T
    in (-1, 1) for unit keys)."""
    return {**x, "beta": (x["beta"].float() * 2).to(x["beta"].dtype)}
