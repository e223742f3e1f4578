"""The chunked prefill's two sequential passes (gatedDeltaRuleChunkWalk.cuh: mma.sync, state in
registers, 1 / 2 / 4 warps a block; gatedDeltaRuleChunkStateKernel: wmma, the fallback) pinned one
at a time, fp16 / bf16, against the fp32 reference on a GPU.

Classes: odd lengths (partial last chunks), Dk != Dv and head dims that are not multiples of 16,
grouped value heads, batches, ragged packs with one-token sequences, 16-bit states,
in-place states, model-like (correlated SiLU) keys. Each warp of the mma.sync walk computes the
same sums whatever the block width, so the three widths must agree bit for bit; on model-like keys
the walk must stay as close to the reference as the wmma walk (the precision it replaces).
Outputs are NaN-poisoned first (tests/ops/gated_delta_rule/test_cuda._run).
"""

import re

import pytest
import torch

from gdn_export.errors import GdnExportError
from tests.conftest import GPU_ONLY, assert_close_rms, gdn_inputs, rel_rms
from tests.ops.gated_delta_rule._cuda_cases import _reference, _run

pytestmark = GPU_ONLY

if torch.cuda.is_available():
    from gdn_export.ops.gated_delta_rule import cuda as cuda_backend

DTYPES16 = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]
WIDTHS = [1, 2, 4]
SHAPES = [  # B, T, Hk, Hv, Dk, Dv
    pytest.param(1, 4097, 2, 6, 128, 128, id="B1-T4097-Hv3Hk-D128"),
    pytest.param(3, 1000, 1, 2, 64, 128, id="B3-T1000-Hv2Hk-Dk64-Dv128"),
    pytest.param(2, 130, 2, 4, 128, 64, id="B2-T130-Dk128-Dv64"),
    pytest.param(2, 300, 1, 3, 40, 24, id="B2-T300-Dk40-Dv24"),
    pytest.param(1, 65, 1, 1, 72, 96, id="B1-T65-Dk72-Dv96"),
    pytest.param(2, 191, 2, 2, 32, 32, id="B2-T191-D32"),
    pytest.param(1, 17, 1, 4, 24, 120, id="B1-T17-Dk24-Dv120"),
]


def _walk_path(width):
    return cuda_backend.PATH_CHUNKED_WALK[width]


@pytest.mark.parametrize("dtype", DTYPES16)
@pytest.mark.parametrize("B,T,Hk,Hv,Dk,Dv", SHAPES)
def test_walk_widths_match_reference_and_each_other(B, T, Hk, Hv, Dk, Dv, dtype):
    x = gdn_inputs(B, T, Hk, Hv, Dk, Dv, dtype=dtype, device="cuda")
    ro, rs = _reference(x)
    outs = {w: _run(x, path=_walk_path(w)) for w in WIDTHS}
    for w, (o, s) in outs.items():
        assert_close_rms(o, ro, dtype, f"o (walk on {w} warps)")
        assert_close_rms(s, rs, dtype, f"final_state (walk on {w} warps)")
    o1, s1 = outs[1]
    for w in WIDTHS[1:]:
        assert torch.equal(outs[w][0], o1), f"o differs between 1 and {w} warps"
        assert torch.equal(outs[w][1], s1), f"final_state differs between 1 and {w} warps"
    o, s = _run(x, path=cuda_backend.PATH_CHUNKED_WMMA)
    assert_close_rms(o, ro, dtype, "o (wmma walk)")
    assert_close_rms(s, rs, dtype, "final_state (wmma walk)")


@pytest.mark.parametrize("dtype", DTYPES16)
@pytest.mark.parametrize("correlated", [False, True], ids=["random-keys", "model-like-keys"])
@pytest.mark.parametrize("B,T,Hk,Hv,Dk,Dv", SHAPES)
def test_split_walk_on_small_grids(B, T, Hk, Hv, Dk, Dv, correlated, dtype):
    """The chunked path unpinned: grids this small (at most 24 blocks of 64 columns) take the split
    walk on an H200 (test_unpinned_small_grid_launches_the_split_walk), two warps a 16-column group,
    half of dk each. Against the fp32 reference, and as close to it as the unsplit 4-warp walk (only
    the order of fp32 sums differs)."""
    x = gdn_inputs(B, T, Hk, Hv, Dk, Dv, dtype=dtype, device="cuda", correlated=correlated)
    ro, rs = _reference(x)
    o, s = _run(x, path=cuda_backend.PATH_CHUNKED)
    assert_close_rms(o, ro, dtype, "o (split walk)")
    assert_close_rms(s, rs, dtype, "final_state (split walk)")
    o4, s4 = _run(x, path=_walk_path(4))
    assert rel_rms(o, ro) <= 1.25 * rel_rms(o4, ro) + 1e-5, (rel_rms(o, ro), rel_rms(o4, ro))
    assert rel_rms(s, rs) <= 1.25 * rel_rms(s4, rs) + 1e-5, (rel_rms(s, rs), rel_rms(s4, rs))


def _walk_variants(fn):
    """(warps, stages, state-row parts) of every mma.sync walk kernel fn launches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    found = set()
    for e in prof.key_averages():
        m = re.search(r"ChunkWalkKernel<([^>]*)>", e.key)
        if m:  # template arguments: T, Dk, warps, stages, parts (the dtype's name may hold digits)
            found.add(tuple(int(n) for n in re.findall(r"\d+", m.group(1))[-3:]))
    return found


def test_unpinned_small_grid_launches_the_split_walk():
    """The launcher's rule, read from the kernels launched: 4-warp blocks of 64 columns that cover at
    most half the multiprocessors run the split walk (two parts), double-buffered; the pinned
    4-warp walk stays unsplit."""
    if torch.cuda.get_device_properties(0).shared_memory_per_block_optin < 210 * 1024:
        pytest.skip("the double-buffered split walk needs ~202 KB of shared memory a block (sm_90 / sm_100)")
    x = gdn_inputs(1, 1000, 2, 4, 128, 128, dtype=torch.bfloat16, device="cuda")  # 8 blocks unsplit
    assert _walk_variants(lambda: _run(x, path=cuda_backend.PATH_CHUNKED)) == {(4, 2, 2)}
    assert _walk_variants(lambda: _run(x)) == {(4, 2, 2)}
    assert _walk_variants(lambda: _run(x, path=_walk_path(4))) == {(4, 2, 1)}


@pytest.mark.parametrize("dtype", DTYPES16)
@pytest.mark.parametrize(
    "lengths", [[1, 63, 66, 1000], [3000, 1, 129, 17, 64]], ids=lambda ls: "-".join(map(str, ls)))
def test_split_walk_ragged_packs(lengths, dtype):
    T = sum(lengths)
    x = gdn_inputs(1, T, 2, 6, 64, 128, dtype=dtype, device="cuda", state=False, correlated=True)
    x["initial_state"] = torch.randn(len(lengths), 6, 64, 128, device="cuda") * 0.1
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    o, s = _run(x, cu_seqlens=cu, path=cuda_backend.PATH_CHUNKED)
    ro, rs = _reference(x, cu_seqlens=cu)
    assert_close_rms(o, ro, dtype, "o (split walk)")
    assert_close_rms(s, rs, dtype, "final_state (split walk)")


@pytest.mark.parametrize("dtype", DTYPES16)
@pytest.mark.parametrize("T", [1000, 4097], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("D", [64, 128], ids=lambda d: f"D{d}")
def test_walk_as_accurate_as_wmma_on_model_like_keys(D, T, dtype):
    x = gdn_inputs(2, T, 2, 4, D, D, dtype=dtype, device="cuda", correlated=True)
    ro, rs = _reference(x)
    o_wmma, s_wmma = _run(x, path=cuda_backend.PATH_CHUNKED_WMMA)
    for w in WIDTHS:
        o, s = _run(x, path=_walk_path(w))
        assert_close_rms(o, ro, dtype, "o")
        assert_close_rms(s, rs, dtype, "final_state")
        # the same hi + lo operands as the wmma walk: only the order of fp32 sums differs
        assert rel_rms(o, ro) <= 1.25 * rel_rms(o_wmma, ro) + 1e-5, (rel_rms(o, ro), rel_rms(o_wmma, ro))
        assert rel_rms(s, rs) <= 1.25 * rel_rms(s_wmma, rs) + 1e-5, (rel_rms(s, rs), rel_rms(s_wmma, rs))


@pytest.mark.parametrize("dtype", DTYPES16)
@pytest.mark.parametrize(
    "lengths",
    [[1, 63, 66, 1000], [2, 700, 1, 5], [64, 64, 128], [3000, 1, 129, 17, 64]],
    ids=lambda ls: "-".join(map(str, ls)),
)
@pytest.mark.parametrize("width", WIDTHS, ids=lambda w: f"w{w}")
@pytest.mark.parametrize("smem", [0, 99 * 1024], ids=["device-smem", "99KB"])  # 99 KB: backend.SMEM_SM86
def test_walk_ragged_packs(smem, width, lengths, dtype):
    """Packs whose sequences end at odd chunk positions, on the device's shared memory and on 99 KB
    (every width single-buffered, bit-equal to the device's choice)."""
    T = sum(lengths)
    x = gdn_inputs(1, T, 2, 6, 64, 128, dtype=dtype, device="cuda", state=False)
    x["initial_state"] = torch.randn(len(lengths), 6, 64, 128, device="cuda") * 0.1
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    o, s = _run(x, cu_seqlens=cu, path=_walk_path(width), smem_limit=smem)
    ro, rs = _reference(x, cu_seqlens=cu)
    assert_close_rms(o, ro, dtype, "o")
    assert_close_rms(s, rs, dtype, "final_state")
    if smem:
        o2, s2 = _run(x, cu_seqlens=cu, path=_walk_path(width))
        assert torch.equal(o, o2) and torch.equal(s, s2), "single and double buffering disagree"


@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float16], ids=["state-bf16", "state-fp16"])
@pytest.mark.parametrize("width", WIDTHS, ids=lambda w: f"w{w}")
def test_walk_16bit_state_in_place(width, state_dtype):
    """The state read and written in its storage dtype, the output buffer being the input state."""
    dtype = torch.bfloat16
    x = gdn_inputs(2, 333, 1, 2, 128, 128, dtype=dtype, device="cuda")
    x["initial_state"] = x["initial_state"].to(state_dtype)
    ref_in = dict(x, initial_state=x["initial_state"].float())
    ro, rs = _reference(ref_in)
    state = x["initial_state"].clone()
    o = torch.full_like(x["v"], float("nan"))
    cuda_backend.gated_delta_rule_out(
        x["q"], x["k"], x["v"], x["g"], x["beta"], state, 128 ** -0.5, True, None, o, state,
        path=_walk_path(width),
    )
    assert_close_rms(o, ro, dtype, "o")
    assert_close_rms(state.float(), rs, state_dtype, "final_state")


def test_pinned_walk_refuses_what_it_does_not_serve():
    x = gdn_inputs(1, 130, 1, 1, 64, 64, dtype=torch.float32, device="cuda")
    with pytest.raises(GdnExportError, match="fp16 / bf16"):
        _run(x, path=_walk_path(2))
    x = gdn_inputs(1, 130, 1, 1, 64, 256, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(GdnExportError, match="multiples of 8 and <= 128"):
        _run(x, path=_walk_path(4))


SMALL_GPUS = [  # shared memory a block may use: the kernel choices of that GPU, run on this one
    pytest.param("SMEM_SM86", id="99KB-sm86"),
    pytest.param("SMEM_SM80", id="163KB-sm80"),
]


@pytest.mark.parametrize("gpu", SMALL_GPUS)
@pytest.mark.parametrize("dtype", DTYPES16)
@pytest.mark.parametrize("B,T,Hk,Hv,Dk,Dv", [SHAPES[0], SHAPES[1], SHAPES[2], SHAPES[3]])
def test_chunked_path_fits_small_gpus(B, T, Hk, Hv, Dk, Dv, dtype, gpu):
    """Under 99 KB (sm_86 / 89 / 120) or 163 KB (sm_80) the default path still runs chunked: the
    prepare kernel and a walk that fits (single-buffered, or at small head dims under 163 KB the
    split walk). The result is bit-equal to the chunked path pinned under the same limit (the
    recurrent kernel, a fallback, would not be), and it matches the reference."""
    smem = getattr(cuda_backend, gpu)
    x = gdn_inputs(B, T, Hk, Hv, Dk, Dv, dtype=dtype, device="cuda", correlated=True)
    ro, rs = _reference(x)
    o, s = _run(x, smem_limit=smem)
    assert_close_rms(o, ro, dtype, "o")
    assert_close_rms(s, rs, dtype, "final_state")
    o_chunked, s_chunked = _run(x, path=cuda_backend.PATH_CHUNKED, smem_limit=smem)
    assert torch.equal(o, o_chunked), "o differs from the chunked path's under the same limit"
    assert torch.equal(s, s_chunked), "final_state differs from the chunked path's under the same limit"


def test_fp32_inputs_under_99KB_fall_back_correctly():
    """fp32 inputs have no chunked kernels that fit 99 KB at Dk = 128: the default path falls back
    to the recurrent kernel there, still correct."""
    x = gdn_inputs(2, 300, 1, 2, 128, 128, dtype=torch.float32, device="cuda")
    ro, rs = _reference(x)
    o, s = _run(x, smem_limit=cuda_backend.SMEM_SM86)
    assert_close_rms(o, ro, torch.float32, "o")
    assert_close_rms(s, rs, torch.float32, "final_state")
