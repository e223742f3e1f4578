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
