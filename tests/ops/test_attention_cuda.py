"""The half-precision GPU paths of gdn::attention against the fp32 path on the same inputs: decode
steps (the split-KV Triton kernel, gdn_export.ops.attention.triton.decode) and ragged prefills (SDPA on the
stored dtype: GQA folded into query rows for small calls, one call per query head with a shared
mask for large ones, B x G x S x L > attention.REPEATED_MASK_MAX)."""

import pytest
import torch

from gdn_export.ops.attention import _attention, attention
from tests.conftest import GPU_ONLY, RMS_BOUND, rel_rms

pytestmark = GPU_ONLY


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("B, H, Hkv, S, L, D", [(2, 16, 2, 1, 4099, 256), (3, 4, 4, 65, 130, 128),
                                                 (1, 8, 2, 63, 63, 64), (1, 16, 2, 2100, 2200, 128)],
                         ids=["decode-gqa8", "prefill-mha", "prefill-gqa4", "prefill-gqa8-per-head-calls"])
def test_half_attention_matches_fp32(cuda_device, dtype, B, H, Hkv, S, L, D):
    gen = torch.Generator(device=cuda_device).manual_seed(0)
    q = torch.randn(B, H, S, D, device=cuda_device, generator=gen).to(dtype)
    k = torch.randn(B, Hkv, L, D, device=cuda_device, generator=gen).to(dtype)
    v = torch.randn(B, Hkv, L, D, device=cuda_device, generator=gen).to(dtype)
    past = torch.randint(0, L - S + 1, (B,), device=cuda_device, generator=gen)
    queries = past[:, None] + torch.arange(S, device=cuda_device)
    mask = (torch.arange(L, device=cuda_device)[None, None, :] <= queries[:, :, None])[:, None]
    got = attention(q, k, v, mask, D ** -0.5)
    assert got.dtype == dtype and got.shape == q.shape
    # The fp32 reference path of the same op (what the CPU and the ONNX graph compute).
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask, scale=D ** -0.5, enable_gqa=H != Hkv)
    assert rel_rms(got.float(), want) <= RMS_BOUND[dtype]
    assert torch.equal(_attention(q, k, v, mask, D ** -0.5), got)
