"""Helpers of the CUDA gated-delta-rule tests that pin a kernel path (test_chunk_walk_cuda.py,
test_op_fast_entry_cuda.py): the extension into NaN-poisoned outputs, and the fp32 reference."""

import torch

from gdn_export.ops.gated_delta_rule.naive import chunked_gated_delta_rule, recurrent_gated_delta_rule


def _reference(x, l2norm=True, cu_seqlens=None):
    """The fp32 reference on x's device: recurrent for one token, chunked otherwise."""
    fn = recurrent_gated_delta_rule if x["v"].shape[1] == 1 else chunked_gated_delta_rule
    return fn(**x, scale=x["q"].shape[-1] ** -0.5, use_qk_l2norm=l2norm, cu_seqlens=cu_seqlens)


def _run(x, l2norm=True, cu_seqlens=None, path=0, smem_limit=0):
    """o [B, T, Hv, Dv] and fp32 final_state [N, Hv, Dk, Dv] written by the extension on `path`."""
    from gdn_export.ops.gated_delta_rule import cuda as cuda_backend

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
