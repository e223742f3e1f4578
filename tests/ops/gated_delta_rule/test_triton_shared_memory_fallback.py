"""The chunked prefill when a launch configuration outgrows the GPU's shared memory (fp32 with
Dk = 256 on an H200 did): the wy kernel retries with narrower value blocks, the chunk kernel with
fewer pipeline stages, and when nothing fits the op says so in one line. Simulated here: Triton's
OutOfResources is raised by a stand-in launcher for the configurations that would not fit."""

import pytest
import torch

from gdn_export.errors import GdnExportError
from gdn_export.ops import gated_delta_rule, use_backend
from gdn_export.ops.gated_delta_rule.naive import chunked_gated_delta_rule
from kernels.gated_delta_rule.triton import chunk
from kernels.gated_delta_rule.triton import wy
from tests.conftest import assert_close_rms, gdn_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter without a GPU


class OutOfResources(Exception):
    """Named like triton.runtime.errors.OutOfResources, which the launchers match by name."""


class TooBig:
    """Launches the real kernel only when `fits(meta)` says the configuration fits."""

    def __init__(self, kernel, fits):
        self.kernel, self.fits, self.tried = kernel, fits, []

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.tried.append({k: v for k, v in meta.items() if k in ("BV", "NUM_STAGES")})
            if not self.fits(meta):
                raise OutOfResources("out of resource: shared memory, Required: 245760, Hardware limit: 232448")
            return self.kernel[grid](*args, **meta)
        return launch


@pytest.fixture(autouse=True)
def forget_fitted_configurations():
    wy._BLOCK_V_THAT_FITS.clear()
    chunk._STAGES_THAT_FIT.clear()
    yield
    wy._BLOCK_V_THAT_FITS.clear()
    chunk._STAGES_THAT_FIT.clear()


def test_narrower_blocks_and_fewer_stages_when_shared_memory_runs_out(monkeypatch):
    x = gdn_inputs(1, 70, 2, 4, 32, 48, seed=3, correlated=True, device=DEVICE)
    wy_launch = TooBig(wy.chunk_wy_fwd_kernel, lambda meta: meta["BV"] <= 16)
    chunk_launch = TooBig(chunk.chunk_state_output_fwd_kernel, lambda meta: meta["NUM_STAGES"] <= 1)
    monkeypatch.setattr(wy, "chunk_wy_fwd_kernel", wy_launch)
    monkeypatch.setattr(chunk, "chunk_state_output_fwd_kernel", chunk_launch)
    with use_backend("triton"):
        o, state = gated_delta_rule(**x, use_qk_l2norm=True)
    ro, rs = chunked_gated_delta_rule(**x, use_qk_l2norm=True)
    assert_close_rms(o, ro, torch.float32, "o")
    assert_close_rms(state, rs, torch.float32, "state")
    assert [t["BV"] for t in wy_launch.tried] == [64, 32, 16]
    assert [t["NUM_STAGES"] for t in chunk_launch.tried] == [3, 2, 1]
    with use_backend("triton"):  # remembered: the next call launches what fitted straight away
        gated_delta_rule(**x, use_qk_l2norm=True)
    assert [t["BV"] for t in wy_launch.tried[3:]] == [16]


def test_nothing_fits_is_one_line(monkeypatch):
    x = gdn_inputs(1, 70, 2, 4, 32, 48, seed=4, device=DEVICE)
    monkeypatch.setattr(wy, "chunk_wy_fwd_kernel", TooBig(wy.chunk_wy_fwd_kernel, lambda meta: False))
    with use_backend("triton"), pytest.raises(GdnExportError) as info:
        gated_delta_rule(**x, use_qk_l2norm=True)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("triton backend: gated delta rule prefill: Dk=32, Dv=48 in float32 needs more "
                              "shared memory than this GPU has (out of resource: shared memory")


def test_fused_form_takes_fewer_stages_when_shared_memory_runs_out(monkeypatch):
    x = gdn_inputs(1, 70, 2, 4, 32, 48, seed=5, correlated=True, device=DEVICE)
    launch = TooBig(chunk.chunk_fused_fwd_kernel, lambda meta: meta["NUM_STAGES"] <= 2)
    monkeypatch.setattr(chunk, "chunk_fused_fwd_kernel", launch)
    monkeypatch.setattr(chunk, "FORM", "fused")
    with use_backend("triton"):
        o, state = gated_delta_rule(**x, use_qk_l2norm=True)
        gated_delta_rule(**x, use_qk_l2norm=True)
    ro, rs = chunked_gated_delta_rule(**x, use_qk_l2norm=True)
    assert_close_rms(o, ro, torch.float32, "o")
    assert_close_rms(state, rs, torch.float32, "state")
    assert [t["NUM_STAGES"] for t in launch.tried] == [3, 2, 2]
