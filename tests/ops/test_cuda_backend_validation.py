"""CPU-runnable: the cuda backend rejects bad tensors with a GdnExportError naming them, before any
kernel (or the extension build) is involved."""

import pytest
import torch

from gdn_export.cuda import extension
from gdn_export.ops.causal_conv1d import cuda as conv_cuda
from gdn_export.ops.gated_delta_rule import cuda as gdr_cuda
from gdn_export.errors import GdnExportError
from tests.conftest import gdn_inputs


@pytest.mark.parametrize(
    "change,name",
    [
        (lambda x: {"initial_state": x["initial_state"][:, :2]}, "initial_state"),
        (lambda x: {"g": x["g"][:, :, :2]}, "g"),
        (lambda x: {"beta": x["beta"][:, :3]}, "beta"),
        (lambda x: {"v": x["v"][:, :, :3]}, "value heads"),
    ],
    ids=["state-heads", "g-heads", "beta-time", "heads-not-multiple"],
)
def test_gated_delta_rule_bad_shape_is_named(change, name):
    x = gdn_inputs(1, 5, 2, 4, 16, 8)
    x.update(change(x))
    with pytest.raises(GdnExportError, match=name):
        gdr_cuda.gated_delta_rule(**x, scale=0.25, use_qk_l2norm=True, cu_seqlens=None)


def test_gated_delta_rule_needs_cuda_tensors():
    x = gdn_inputs(1, 5, 2, 4, 16, 8)
    with pytest.raises(GdnExportError, match="CUDA tensors, got q on cpu"):
        gdr_cuda.gated_delta_rule(**x, scale=0.25, use_qk_l2norm=True, cu_seqlens=None)


def test_conv_kernel_too_long_is_named():
    x = torch.randn(1, 4, 8)
    with pytest.raises(GdnExportError, match="kernel size must be 1..8, got 9"):
        conv_cuda.causal_conv1d(x, torch.randn(8, 9), None, None, True)


def test_conv_bad_state_is_named():
    x = torch.randn(2, 4, 8)
    with pytest.raises(GdnExportError, match="conv_state"):
        conv_cuda.causal_conv1d(x, torch.randn(8, 4), None, torch.randn(2, 8, 2), True)


def test_unavailable_without_gpu_is_one_line():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the extension may build")
    with pytest.raises(GdnExportError, match="^cuda backend unavailable: "):
        extension.load()


@pytest.mark.parametrize(
    "path,dtype,Dk,Dv,smem,message",
    [
        (gdr_cuda.PATH_AUTO, torch.bfloat16, 128, 128, 48 * 1024, "smem_limit must be 0 or >= 101376"),
        (gdr_cuda.PATH_CHUNKED_WALK[4], torch.bfloat16, 128, 128, -1, "smem_limit must be 0 or >= 101376"),
        (gdr_cuda.PATH_CHUNKED, torch.float32, 128, 128, gdr_cuda.SMEM_SM80, "wmma walk .* takes none"),
        (gdr_cuda.PATH_CHUNKED_WMMA, torch.bfloat16, 64, 64, gdr_cuda.SMEM_SM86, "wmma walk .* takes none"),
    ],
    ids=["auto-48KB", "walk4-negative", "chunked-fp32-163KB", "wmma-bf16-99KB"],
)
def test_smem_limit_the_kernels_cannot_meet_is_named(path, dtype, Dk, Dv, smem, message):
    x = gdn_inputs(1, 5, 1, 1, Dk, Dv, dtype=dtype)
    with pytest.raises(GdnExportError, match=message):
        gdr_cuda._check_path(path, x["q"], x["v"], smem)


@pytest.mark.parametrize("smem", [gdr_cuda.SMEM_SM86, gdr_cuda.SMEM_SM80], ids=["99KB", "163KB"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_smem_limits_of_supported_gpus_pass_the_check_for_16bit(dtype, smem):
    x = gdn_inputs(1, 5, 1, 1, 128, 128, dtype=dtype)
    for path in (gdr_cuda.PATH_AUTO, gdr_cuda.PATH_CHUNKED, *gdr_cuda.PATH_CHUNKED_WALK.values()):
        gdr_cuda._check_path(path, x["q"], x["v"], smem)
    x = gdn_inputs(1, 5, 1, 1, 128, 128, dtype=torch.float32)
    gdr_cuda._check_path(gdr_cuda.PATH_AUTO, x["q"], x["v"], smem)  # fp32 falls back to the recurrent kernel


@pytest.mark.parametrize(
    "path,dtype,Dk,Dv,message",
    [
        (7, torch.bfloat16, 64, 64, "unknown kernel path 7"),
        (gdr_cuda.PATH_CHUNKED, torch.bfloat16, 64, 256, "multiples of 8 and <= 128"),
        (gdr_cuda.PATH_CHUNKED_WMMA, torch.float16, 36, 64, "multiples of 8 and <= 128"),
        (gdr_cuda.PATH_CHUNKED_WALK[4], torch.float32, 64, 64, "fp16 / bf16"),
        (gdr_cuda.PATH_CHUNKED_WALK[1], torch.float32, 64, 64, "fp16 / bf16"),
    ],
    ids=["unknown", "chunked-Dv256", "wmma-Dk36", "walk4-fp32", "walk1-fp32"],
)
def test_pinned_path_the_kernels_refuse_is_named(path, dtype, Dk, Dv, message):
    # checked before the extension, whose failing checks have crashed the process on the H200 image
    x = gdn_inputs(1, 5, 1, 1, Dk, Dv, dtype=dtype)
    with pytest.raises(GdnExportError, match=message):
        gdr_cuda._check_path(path, x["q"], x["v"])


@pytest.mark.parametrize("path", [gdr_cuda.PATH_AUTO, gdr_cuda.PATH_RECURRENT, gdr_cuda.PATH_CHUNKED,
                                  gdr_cuda.PATH_CHUNKED_WMMA, *gdr_cuda.PATH_CHUNKED_WALK.values()])
def test_pinned_paths_that_serve_bf16_pass_the_check(path):
    x = gdn_inputs(1, 5, 1, 1, 64, 128, dtype=torch.bfloat16)
    gdr_cuda._check_path(path, x["q"], x["v"])
