"""Head-split inputs read in place: the attention's q / k and the GDN's output gate z reach their norms
as [B, T, H, D] views of one slice of a fused projection's output ([B, T, N] with N wider than H D),
whose rows (token, head) sit at two strides. `glue.head_rows` hands such a view to the kernel without
a copy, and the kernel gives bit for bit what it gives on contiguous copies (same arithmetic, only the
addresses differ); the output is poisoned first. Plain, zero-centred, gated and the residual add, odd
head counts and widths, B > 1. Under TRITON_INTERPRET=1 on a CPU-only machine; with a GPU, on it."""

from __future__ import annotations

import pytest
import torch

import gdn_export.ops.rms_norm as op
from gdn_export.ops import glue
from tests.ops.impl import HAS_CUDA, poisoned

DEVICE = "cuda" if HAS_CUDA else "cpu"


def _head_split(B, T, H, D, extra, offset, dtype, gen):
    """A [B, T, H, D] view of channels offset .. offset + H D of a [B, T, H D + extra] tensor, the
    heads at a stride of D (a q slice) or, with extra == H D, interleaved at 2 D (q | gate per head)."""
    if extra == H * D:  # per head [q | gate], as the gated attention's q projection
        wide = torch.randn(B, T, H, 2 * D, generator=gen).to(dtype).to(DEVICE)
        return wide[..., offset:offset + D]
    wide = torch.randn(B, T, H * D + extra, generator=gen).to(dtype).to(DEVICE)
    return wide[..., offset:offset + H * D].unflatten(-1, (H, D))


@pytest.mark.parametrize("B,T,H,D,extra", [(1, 37, 4, 24, 40), (3, 5, 2, 16, 32), (2, 9, 3, 16, 48),
                                           (1, 1, 16, 8, 9)],
                         ids=["B1-T37-H4-D24-slice", "B3-T5-H2-D16-interleaved", "B2-T9-H3-D16-interleaved",
                              "decode-H16-D8-slice"])
@pytest.mark.parametrize("kind", ["plain", "zero", "gated", "add"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_head_split_views_are_read_in_place(B, T, H, D, extra, kind, dtype):
    gen = torch.Generator().manual_seed(B * 100 + T)
    x = _head_split(B, T, H, D, extra, 0 if extra == H * D else 3, dtype, gen)
    storage = x.untyped_storage().data_ptr()
    if extra != H * D and T > 1:  # a slice's rows sit at two strides: `rows` copies it
        assert glue.rows(x).untyped_storage().data_ptr() != storage
    second = _head_split(B, T, H, D, extra, D if extra == H * D else 7, dtype, gen)
    view = glue.head_rows(x)
    assert view.data_ptr() == x.data_ptr() and view.untyped_storage().data_ptr() == storage, \
        "head_rows copied a head split"
    w = (torch.rand(D, generator=gen) + 0.5).to(DEVICE)
    eps, zero = 1e-6, kind == "zero"
    if kind == "add":
        out, out_sum = poisoned(x.shape, dtype, DEVICE), poisoned(x.shape, dtype, DEVICE)
        s, y = op.add_rms_norm_fused(x, second, w, eps, True, out=out, out_sum=out_sum)
        s_ref, y_ref = op.add_rms_norm_fused(x.contiguous(), second.contiguous(), w, eps, True)
        assert torch.equal(s, s_ref)
    else:
        gate = second if kind == "gated" else None
        y = op.rms_norm_fused(x, w, eps, zero, gate, out=poisoned(x.shape, dtype, DEVICE))
        y_ref = op.rms_norm_fused(x.contiguous(), w, eps, zero, None if gate is None else gate.contiguous())
    assert not torch.isnan(y).any()
    assert torch.equal(y, y_ref)
