"""The CUDA kernels with an fp16 / bf16 recurrent state, on a GPU: what depends on this GPU (the
decode kernel's tile width, picked by the multiprocessor count) and the op's refusal of mixed state
buffers. The state-dtype grid, packs and in-place chains are in tests/ops/gated_delta_rule."""

import pytest
import torch

from gdn_export.ops.gated_delta_rule.naive import chunked_gated_delta_rule, recurrent_gated_delta_rule
from tests.conftest import GPU_ONLY, RMS_BOUND, gdn_inputs, rel_rms

pytestmark = GPU_ONLY

if torch.cuda.is_available():
    from gdn_export.ops.gated_delta_rule import cuda as cuda_backend

STATE_DTYPES = [pytest.param(torch.bfloat16, id="bf16-state"), pytest.param(torch.float16, id="fp16-state")]
# Kernel and reference round nearly equal fp32 values: now and then one 16-bit step apart.
STATE_BOUND = {torch.bfloat16: 6e-3, torch.float16: 1e-3}


def _check(x, dtype, state_dtype, cu_seqlens=None, path=0, in_place=False):
    """in_place: final_state is the initial state's buffer. No initial state: the kernel gets None,
    the reference zeros of the state dtype."""
    B, T, _, Dk = x["q"].shape
    Hv, Dv = x["v"].shape[2:]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    given = x["initial_state"]
    if given is None:
        x = dict(x, initial_state=torch.zeros(N, Hv, Dk, Dv, dtype=state_dtype, device="cuda"))
    else:
        x = dict(x, initial_state=given.to(state_dtype))
    o = torch.full((B, T, Hv, Dv), float("nan"), dtype=dtype, device="cuda")
    s = x["initial_state"].clone() if in_place else \
        torch.full((N, Hv, Dk, Dv), float("nan"), dtype=state_dtype, device="cuda")
    cuda_backend.gated_delta_rule_out(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                      None if given is None else (s if in_place else x["initial_state"]),
                                      Dk ** -0.5, True, cu_seqlens, o, s, path=path)
    fn = recurrent_gated_delta_rule if T <= 16 else chunked_gated_delta_rule
    ro, rs = fn(**x, use_qk_l2norm=True, cu_seqlens=cu_seqlens)
    assert rs.dtype == state_dtype
    assert rel_rms(o, ro) <= RMS_BOUND[dtype], ("o", rel_rms(o, ro))
    assert rel_rms(s, rs) <= max(RMS_BOUND[dtype], STATE_BOUND[state_dtype]), ("final_state", rel_rms(s, rs))


@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("Dk,Dv", [(128, 128), (64, 100), (256, 256), (32, 72), (16, 40)], ids=lambda d: str(d))
@pytest.mark.parametrize("tile", ["32-columns-4-warps", "32-columns-2-warps", "64-columns-4-warps"])
def test_decode_step_tile_widths(tile, Dk, Dv, state_dtype):
    """The launcher's three tiles, picked by 64-column tiles per multiprocessor (launchRecurrentTile):
    at most half a tile each, 32 columns on 4 warps (where Dk has a row per row group: not at 16);
    up to 4 each, 32 columns on 2 warps; beyond, 64 columns on 4 warps. B is chosen from this GPU's
    multiprocessor count to land in each range; odd Dv, in place."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    per_row = (Dv + 63) // 64 * 6  # 64-column tiles of one sequence at Hv = 6
    B = {"32-columns-4-warps": max(1, sms // (2 * per_row)), "32-columns-2-warps": 2 * sms // per_row,
         "64-columns-4-warps": 4 * sms // per_row + 1}[tile]
    tiles = per_row * B
    assert {"32-columns-4-warps": 2 * tiles <= sms or B == 1, "32-columns-2-warps": sms < 2 * tiles <= 8 * sms,
            "64-columns-4-warps": tiles > 4 * sms}[tile]
    x = gdn_inputs(B, 1, 3, 6, Dk, Dv, dtype=torch.bfloat16, device="cuda", correlated=True)
    _check(x, torch.bfloat16, state_dtype, in_place=True)


def test_op_returns_the_state_dtype_and_rejects_mixed_buffers():
    from gdn_export.errors import GdnExportError
    from gdn_export.ops import gated_delta_rule, use_backend

    x = gdn_inputs(2, 70, 2, 4, 128, 128, dtype=torch.bfloat16, device="cuda", state=False)
    with use_backend("cuda"):
        _, s = gated_delta_rule(**x, use_qk_l2norm=True, state_dtype=torch.bfloat16)
    assert s.dtype == torch.bfloat16
    with pytest.raises(GdnExportError, match="initial_state must be a contiguous torch.bfloat16"):
        cuda_backend.gated_delta_rule_out(x["q"], x["k"], x["v"], x["g"], x["beta"], s.float(), 0.1, True,
                                          None, torch.empty_like(x["v"]), torch.empty_like(s))
