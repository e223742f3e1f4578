"""Triton gated-delta-rule kernels: what is theirs alone (which head dims take 16-bit operands, the
chunk table of a cu_seqlens pack and its caching, gates computed in the kernel, the backend's choice
of kernel). Their numerics against the float64 oracle are in tests/ops/gated_delta_rule.

On a CPU-only machine these run under TRITON_INTERPRET=1 (see conftest.py); with a GPU, on it.
"""

import pytest
import torch

from gdn_export.ops.gated_delta_rule.naive import recurrent_gated_delta_rule
from tests.conftest import assert_close_rms, gdn_inputs

from kernels.gated_delta_rule.triton.chunk import chunk_gated_delta_rule
from kernels.gated_delta_rule.triton.gates import gated_delta_rule_from_gates
from kernels.triton_utils import check_cu_seqlens, chunk_indices, raw_operands

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype,Dk,Dv,raw", [
    pytest.param(torch.bfloat16, 128, 128, True, id="bf16-128"),
    pytest.param(torch.float16, 64, 192, True, id="fp16-64x192"),
    pytest.param(torch.bfloat16, 16, 24, False, id="bf16-16x24"),
    pytest.param(torch.bfloat16, 128, 96, False, id="bf16-128x96"),
    pytest.param(torch.float32, 128, 128, False, id="fp32-128"),
])
def test_raw_operands_only_for_verified_head_dims(dtype, Dk, Dv, raw):
    # the small-dim shapes of the tests above (and the tiny models) take the fp32-operand path
    assert raw_operands(dtype, Dk, Dv) is raw


@pytest.mark.parametrize("where", ["host", "device"])
@pytest.mark.parametrize("lens", [[1], [64], [65, 0, 3], [0, 200, 64, 1, 0, 129], [63] * 7],
                         ids=lambda v: "-".join(map(str, v)))
def test_chunk_indices_cover_every_chunk_once(lens, where):
    """The padded (sequence, chunk) table, built from host offsets (eager) or on the device (graph
    capture): every chunk of every sequence once, in order, then (-1, 0) padding up to
    total // 64 + N rows (a grid that never depends on the lengths)."""
    cu = torch.tensor([0] + lens, device=DEVICE).cumsum(0).to(torch.int32)
    offsets = cu.tolist() if where == "host" else None
    got = chunk_indices(cu, sum(lens), offsets).tolist()
    want = [[n, c] for n, t in enumerate(lens) for c in range(-(-t // 64))]
    assert len(got) == sum(lens) // 64 + len(lens)
    assert got[:len(want)] == want
    assert all(row == [-1, 0] for row in got[len(want):])


@pytest.mark.parametrize("cu,message", [([1, 5, 9], "run from 0"), ([0, 5, 8], "run from 0"),
                                        ([0, 6, 4, 9], "must not decrease")],
                         ids=["start", "end", "decreasing"])
def test_bad_cu_seqlens_is_one_line_error(cu, message):
    x = gdn_inputs(1, 9, 1, 1, 16, 16, device=DEVICE, state=False)
    with pytest.raises(ValueError, match=message):
        chunk_gated_delta_rule(**x, cu_seqlens=torch.tensor(cu, device=DEVICE))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_cu_seqlens_read_once_per_version(dtype):
    """A model passes one cu_seqlens to every layer: the first call reads and checks it, later calls
    with the same unchanged tensor reuse that (same int32 tensor, same chunk table, no host read);
    an in-place change is read again, and checked again."""
    cu = torch.tensor([0, 5, 70, 70, 200], dtype=dtype, device=DEVICE)
    first, offsets = check_cu_seqlens(cu, 200)
    assert offsets == [0, 5, 70, 70, 200]
    table = chunk_indices(first, 200, offsets)
    again, offsets2 = check_cu_seqlens(cu, 200)
    assert again is first and offsets2 is offsets and chunk_indices(again, 200, offsets2) is table
    cu[1] = 64  # through PyTorch: the version moves
    changed, offsets3 = check_cu_seqlens(cu, 200)
    assert offsets3 == [0, 64, 70, 70, 200] and changed.tolist() == offsets3
    assert chunk_indices(changed, 200, offsets3).tolist()[:4] == [[0, 0], [1, 0], [3, 0], [3, 1]]
    cu[2] = 10
    with pytest.raises(ValueError, match="must not decrease"):
        check_cu_seqlens(cu, 200)
    with pytest.raises(ValueError, match="run from 0"):
        check_cu_seqlens(torch.tensor([0, 5, 70, 70, 200], device=DEVICE), 199)


def test_cu_seqlens_without_a_version_is_read_every_call():
    with torch.inference_mode():
        cu = torch.tensor([0, 3, 9], device=DEVICE)
        first, offsets = check_cu_seqlens(cu, 9)
        again, _ = check_cu_seqlens(cu, 9)
        assert offsets == [0, 3, 9] and again is not first


@pytest.mark.parametrize("T,D,form", [pytest.param(3, 16, None, id="recurrent-T3"),
                                      *[pytest.param(70, D, form, id=f"chunk-T70-D{D}-{form}")
                                        for D in (16, 64) for form in ("two-pass", "fused")]])
def test_gates_computed_in_kernel(T, D, form, monkeypatch):
    """a, b, A_log, dt_bias turned into g and beta inside the kernels (the chunked ones in either form)."""
    from kernels.gated_delta_rule.triton import chunk

    if form is not None:
        monkeypatch.setattr(chunk, "FORM", form)
    x = gdn_inputs(2, T, 1, 2, D, D, dtype=torch.bfloat16, device=DEVICE)
    a, b = (torch.randn(2, T, 2, device=DEVICE).to(torch.bfloat16) for _ in range(2))
    A_log, dt_bias = torch.randn(2, device=DEVICE) * 0.5, torch.randn(2, device=DEVICE)
    g = -A_log.exp() * torch.nn.functional.softplus(a.float() + dt_bias)
    beta = torch.sigmoid(b.float())
    ref = dict(x, g=g, beta=beta)
    ro, rs = recurrent_gated_delta_rule(**{n: t.cpu() for n, t in ref.items()}, use_qk_l2norm=True)
    o, s = gated_delta_rule_from_gates(x["q"], x["k"], x["v"], a, b, A_log, dt_bias,
                                       x["initial_state"], use_qk_l2norm=True)
    assert_close_rms(o.cpu(), ro, torch.bfloat16, "o")
    assert_close_rms(s.cpu(), rs, torch.bfloat16, "final_state")


def test_unknown_form_is_one_line_error():
    x = gdn_inputs(1, 70, 1, 2, 16, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"form must be one of two-pass, fused, got 'one-pass'"):
        chunk_gated_delta_rule(**x, form="one-pass")


def test_rejects_more_key_heads_than_fit():
    x = gdn_inputs(1, 4, 2, 3, 16, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"value heads \(3\) must be a multiple of key heads \(2\)"):
        chunk_gated_delta_rule(**x)


@pytest.mark.parametrize("lens,short", [([16], True), ([17], False), ([3, 5, 8], True), ([1] * 40, True),
                                        ([100, 1], False), ([1, 1, 1, 40], False), ([30, 1, 1], False)],
                         ids=lambda v: "-".join(map(str, v)) if isinstance(v, list) else str(v))
def test_backend_picks_recurrent_only_for_short_sequences(lens, short):
    """The triton backend runs the recurrent kernel when every sequence has at most RECURRENT_MAX_T
    (16) tokens, the chunked one otherwise; a pack whose size alone decides (total <= 16, or a mean
    over 16) is not read on the host."""
    from gdn_export.ops.gated_delta_rule.triton import _short

    v = torch.empty(1, sum(lens), 1, 8)
    cu = torch.tensor([0] + lens).cumsum(0)
    assert _short(v, cu) is short
    if sum(lens) > 16 * len(lens):  # decided by the mean: the lengths must not be needed
        assert _short(v, torch.zeros(len(lens) + 1, dtype=torch.int64)) is False


def test_triton_backend_returns_the_state_dtype():
    """state_dtype= without an initial state: the op hands the kernel a zero state of that dtype, and
    the state comes back in it through the next call."""
    from gdn_export.ops import gated_delta_rule, use_backend

    x = gdn_inputs(1, 20, 1, 2, 16, 16, dtype=torch.bfloat16, device=DEVICE, state=False)
    with use_backend("triton"):
        _, s = gated_delta_rule(**x, use_qk_l2norm=True, state_dtype=torch.bfloat16)
        _, s1 = gated_delta_rule(**{n: v[:, :1] for n, v in x.items() if v is not None},
                                 initial_state=s, use_qk_l2norm=True)
    assert s.dtype == torch.bfloat16 and s1.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype,D,T,state", [
    pytest.param(torch.bfloat16, 64, 130, True, id="bf16-D64-T130"),
    pytest.param(torch.float16, 64, 64, True, id="fp16-D64-T64"),
    pytest.param(torch.bfloat16, 48, 100, True, id="bf16-D48-T100-fp32-copies"),
    pytest.param(torch.float32, 32, 70, False, id="fp32-D32-T70-no-state"),
])
def test_state_held_kv_matches_the_default(dtype, D, T, state):
    """chunk_state_output_fwd(kv_state=True) (the state as [Dk, BV], k read transposed: the sweep's
    variant) against the float64 oracle within its dtype's bound, and against the default layout,
    whose sums it repeats in another order of the same products."""
    from kernels.gated_delta_rule.triton.chunk import chunk_state_output_fwd
    from kernels.gated_delta_rule.triton.wy import chunk_wy_fwd

    x = gdn_inputs(2, T, 2, 4, D, D, dtype=dtype, device=DEVICE, seed=1, correlated=True)
    if not state:
        x["initial_state"] = None
    q, k, v, g, beta, h0 = (x[n] for n in ("q", "k", "v", "g", "beta", "initial_state"))
    wy = chunk_wy_fwd(q, k, v, g, beta, D ** -0.5, True)
    o, s = torch.full_like(v, float("nan")), torch.full((2, 4, D, D), float("nan"), device=DEVICE)
    chunk_state_output_fwd(q, k, *wy, h0, out=o, final_state=s, kv_state=True)
    want_o, want_s = recurrent_gated_delta_rule(**{n: t.double() if t is not None else None for n, t in x.items()},
                                                use_qk_l2norm=True)
    assert_close_rms(o.float(), want_o.float(), dtype, "o")
    assert_close_rms(s, want_s.float(), torch.float32 if dtype == torch.float32 else dtype, "final state")
    o_vk, s_vk = chunk_state_output_fwd(q, k, *wy, h0)
    torch.testing.assert_close(o, o_vk, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(s, s_vk, rtol=1e-4, atol=1e-4)
