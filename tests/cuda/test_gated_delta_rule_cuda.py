"""The CUDA gated delta rule kernels (cuda backend) on a GPU, against the fp32 reference.

Grid: T in {1, 63, 64, 65, 1000, 4097} x D in {64, 128} x Hv in {Hk, 2 Hk} x B in {1, 3} x
{fp32, bf16, fp16}, through the default path choice; then each path pinned (recurrent for long T,
chunked for short T), Dk != Dv and odd head sizes, packed sequences against the per-sequence
reference, no initial state, no L2 norm, and in-place decode. Outputs are NaN-poisoned first.
"""

import pytest
import torch
import torch.nn.functional as F

from gdn_export.ops.gated_delta_rule.naive import chunked_gated_delta_rule, recurrent_gated_delta_rule
from tests.conftest import DTYPES, GPU_ONLY, assert_close_rms, gdn_inputs

pytestmark = GPU_ONLY

if torch.cuda.is_available():
    from gdn_export.cuda import backend as cuda_backend

HEADS = [pytest.param(2, 2, id="Hv=Hk"), pytest.param(2, 4, id="Hv=2Hk")]


def _inputs(B, T, Hk, Hv, Dk, Dv, dtype, l2norm=True, state=True):
    x = gdn_inputs(B, T, Hk, Hv, Dk, Dv, dtype=dtype, device="cuda", state=state)
    if not l2norm:
        # without the in-kernel norm, unit keys keep the recurrence contractive
        x["k"] = F.normalize(x["k"].float(), dim=-1).to(dtype)
    return x


def _reference(x, l2norm=True, cu_seqlens=None):
    fn = recurrent_gated_delta_rule if x["v"].shape[1] == 1 else chunked_gated_delta_rule
    return fn(**x, scale=x["q"].shape[-1] ** -0.5, use_qk_l2norm=l2norm, cu_seqlens=cu_seqlens)


def _run(x, l2norm=True, cu_seqlens=None, path=0, smem_limit=0):
    B, T, _, Dk = x["q"].shape
    Hv, Dv = x["v"].shape[2:]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    o = torch.full((B, T, Hv, Dv), float("nan"), dtype=x["v"].dtype, device="cuda")
    s = torch.full((N, Hv, Dk, Dv), float("nan"), device="cuda")
    cuda_backend.gated_delta_rule_out(
        x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], Dk ** -0.5, l2norm, cu_seqlens,
        o, s, path=path, smem_limit=smem_limit,
    )
    return o, s


def _check(x, dtype, l2norm=True, cu_seqlens=None, path=0):
    o, s = _run(x, l2norm, cu_seqlens, path)
    ro, rs = _reference(x, l2norm, cu_seqlens)
    assert_close_rms(o, ro, dtype, "o")
    assert_close_rms(s, rs, dtype, "final_state")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B", [1, 3], ids=lambda b: f"B{b}")
@pytest.mark.parametrize("Hk,Hv", HEADS)
@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
@pytest.mark.parametrize("T", [1, 63, 64, 65, 1000, 4097], ids=lambda t: f"T{t}")
def test_grid(T, D, Hk, Hv, B, dtype):
    _check(_inputs(B, T, Hk, Hv, D, D, dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
@pytest.mark.parametrize("T", [65, 1000, 4097], ids=lambda t: f"T{t}")
def test_correlated_keys(T, D, dtype):
    # keys as models make them (see gdn_inputs): the chunk inverse must stay accurate
    _check(gdn_inputs(2, T, 2, 4, D, D, dtype=dtype, device="cuda", correlated=True), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "T,path",
    [
        pytest.param(1, 2, id="T1-chunked"),
        pytest.param(5, 2, id="T5-chunked"),
        pytest.param(200, 1, id="T200-recurrent"),
        pytest.param(1000, 1, id="T1000-recurrent"),
        pytest.param(16, 1, id="T16-recurrent"),
        pytest.param(17, 0, id="T17-auto"),
    ],
)
def test_pinned_paths(T, path, dtype):
    _check(_inputs(2, T, 2, 4, 64, 64, dtype), dtype, path=path)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "Dk,Dv",
    [(64, 128), (128, 64), (32, 64), (16, 16), (24, 40), (40, 24), (72, 96), (256, 64), (20, 36)],
    ids=lambda d: str(d),
)
@pytest.mark.parametrize("T", [1, 130], ids=lambda t: f"T{t}")
def test_head_sizes(T, Dk, Dv, dtype):
    _check(_inputs(2, T, 1, 3, Dk, Dv, dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("l2norm", [True, False], ids=["l2norm", "no-l2norm"])
@pytest.mark.parametrize("state", [True, False], ids=["state", "no-state"])
@pytest.mark.parametrize("T", [1, 7, 300], ids=lambda t: f"T{t}")
def test_options(T, state, l2norm, dtype):
    x = _inputs(2, T, 2, 2, 64, 64, dtype, l2norm=l2norm, state=state)
    _check(x, dtype, l2norm=l2norm)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "lengths",
    [[1, 63, 66, 1000], [5, 3, 1], [64, 64, 128], [1, 1, 1, 1, 1], [700], [17, 300, 2, 65]],
    ids=lambda ls: "-".join(map(str, ls)),
)
def test_varlen(lengths, dtype):
    T = sum(lengths)
    x = _inputs(1, T, 2, 4, 64, 64, dtype, state=False)
    x["initial_state"] = torch.randn(len(lengths), 4, 64, 64, device="cuda") * 0.1
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    _check(x, dtype, cu_seqlens=cu)
    # and the same pack through the recurrent kernel
    _check(x, dtype, cu_seqlens=cu, path=1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 3], ids=lambda t: f"T{t}")
def test_inplace_decode(T, dtype):
    x = _inputs(3, T, 2, 4, 128, 128, dtype)
    ro, rs = _reference(x)
    state = x["initial_state"].clone()
    o = cuda_backend.gated_delta_rule_inplace(
        x["q"], x["k"], x["v"], x["g"], x["beta"], state, 128 ** -0.5, True
    )
    assert_close_rms(o, ro, dtype, "o")
    assert_close_rms(state, rs, dtype, "state (in place)")


def test_backend_entry_point_and_fresh_outputs():
    from gdn_export.ops import gated_delta_rule, use_backend

    x = _inputs(1, 100, 2, 2, 64, 64, torch.bfloat16)
    with use_backend("cuda"):
        o, s = gated_delta_rule(**x, use_qk_l2norm=True)
    ro, rs = _reference(x)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    assert s.data_ptr() != x["initial_state"].data_ptr()
    assert_close_rms(o, ro, torch.bfloat16, "o")
    assert_close_rms(s, rs, torch.bfloat16, "final_state")


def test_extension_names_problems_without_raising():
    """The extension names each bad input's problem and returns it rather than raising (the op's fast
    entries rely on these checks). Its failing checks had ended the process with a segmentation
    fault on the H200 image since 2026-11-30: c10's operator<< formatting a shape (torch 2.11+cu130); the
    messages are now built without it."""
    x = _inputs(1, 4, 2, 2, 64, 64, torch.float32)
    bad = {"initial_state": x["initial_state"][:, :1].contiguous(), "g": x["g"].half(),
           "q": x["q"].transpose(1, 2).contiguous().transpose(1, 2), "beta": x["beta"].cpu(),
           "k": x["k"][:, :3].contiguous()}
    for name, t in bad.items():
        args = dict(x, **{name: t})
        out, problem = cuda_backend.load().gated_delta_rule(
            args["q"], args["k"], args["v"], args["g"], args["beta"], args["initial_state"], 0.125, True, None
        )
        assert out == [] and problem.startswith(f"{name} must"), (name, problem)
    out, problem = cuda_backend.load().gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], 0.125, True, None, path=9)
    assert out == [] and problem.startswith("path must be"), problem
