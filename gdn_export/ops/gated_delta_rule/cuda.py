"""The gated delta rule through our CUDA kernels (kernels/gated_delta_rule/cuda/gatedDeltaRuleKernels.cu,
bound by gdn_export/cuda/extension.cpp and built by gdn_export.cuda.extension): the `cuda` backend's
entries for this op (gdn_export.ops.cuda_backend).

    gated_delta_rule(q [B, T, Hk, Dk], k [B, T, Hk, Dk], v [B, T, Hv, Dv], g [B, T, Hv],
                     beta [B, T, Hv], initial_state [N, Hv, Dk, Dv] S | None, scale,
                     use_qk_l2norm, cu_seqlens [N + 1] | None) -> (o [B, T, Hv, Dv], final_state S)
        S: the state's storage dtype, fp32, fp16 or bf16 (fp32 for None; float64 runs as fp32).
    gated_delta_rule_out(..., o, final_state): into given buffers (final_state may be initial_state)
    gated_delta_rule_inplace(..., state, ...) -> o: the state updated where it lies (decode)
    gated_delta_rule_steps(q, k, v, g, beta, initial_state, scale, use_qk_l2norm)
        -> (o, states [B, T, Hv, Dk, Dv] S): the state after every token (speculative decoding)
    gated_delta_rule_fast / gated_delta_rule_inplace_fast: the public op's eager entries (None back
        where the checked entries must run)

Activations are fp32, fp16 or bf16 (q, k, beta are cast to v's dtype, g to fp32; float64 runs in
fp32 and is cast back). Tensors must be on a CUDA device.
"""

from __future__ import annotations

import torch

from gdn_export.cuda import extension
from gdn_export.cuda.extension import check_out, compute_dtype, require_cuda
from gdn_export.errors import GdnExportError
from gdn_export.ops.gated_delta_rule import STATE_DTYPES
from gdn_export.ops.gated_delta_rule import check_inputs as _check_gdr_inputs
from gdn_export.ops.gated_delta_rule import state_storage_dtype

# Kernel path selector of the extension (tests and benchmarks pin one).
PATH_AUTO, PATH_RECURRENT, PATH_CHUNKED = 0, 1, 2
# The chunked path with its sequential pass pinned: the wmma walk, or the mma.sync walk (fp16 / bf16
# inputs) on 1, 2 or 4 warps a block (gdn::GatedDeltaRulePath).
PATH_CHUNKED_WMMA, PATH_CHUNKED_WALK = 3, {1: 4, 2: 5, 4: 6}
# Shared memory a block may use on the GPUs the chunked path is built for (bytes): tests and
# benchmarks pass one as smem_limit to run that GPU's kernel choices on a larger one.
SMEM_SM86 = 99 * 1024  # sm_86 / 89 / 120
SMEM_SM80 = 163 * 1024


def _gdr_args(q, k, v, g, beta, initial_state, cu_seqlens):
    # Shapes are checked here, before the extension: its own checks are a second line of defence.
    try:
        _check_gdr_inputs(q, k, v, g, beta, initial_state, cu_seqlens)
    except ValueError as exc:
        raise GdnExportError(f"cuda backend: {exc}") from exc
    require_cuda(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, cu_seqlens=cu_seqlens)
    dt = compute_dtype(v.dtype, "v")
    q, k, v, beta = (x.to(dt).contiguous() for x in (q, k, v, beta))
    g = g.to(torch.float32).contiguous()
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.to(torch.int32).contiguous()
    return q, k, v, g, beta, cu_seqlens


def _check_path(path, q, v, smem_limit=0):
    """A pinned path the kernels would refuse, as a one-line error before the extension (whose failing
    checks have crashed the process on the H200 image; see tests/ops/gated_delta_rule/test_cuda.py).
    smem_limit: 0 (the device's shared memory) or at least SMEM_SM86 bytes, where the prepare kernel
    and the mma.sync walk fit for fp16 / bf16 inputs; the wmma walk (pinned, or the walk of fp32
    inputs) needs more at Dk = 128, so a pinned path that runs it takes no cap (unpinned, fp32 inputs
    fall back to the recurrent kernel under a cap, as on such a GPU)."""
    if path not in (PATH_AUTO, PATH_RECURRENT, PATH_CHUNKED, PATH_CHUNKED_WMMA, *PATH_CHUNKED_WALK.values()):
        raise GdnExportError(f"cuda backend: unknown kernel path {path}")
    if smem_limit != 0 and smem_limit < SMEM_SM86:
        raise GdnExportError(f"cuda backend: smem_limit must be 0 or >= {SMEM_SM86} bytes, got {smem_limit}")
    if smem_limit and (path == PATH_CHUNKED_WMMA or (path == PATH_CHUNKED and v.dtype == torch.float32)):
        raise GdnExportError("cuda backend: smem_limit serves the mma.sync walk (fp16 / bf16 inputs); a pinned "
                             "wmma walk (or fp32 chunked path) takes none")
    Dk, Dv = q.shape[-1], v.shape[-1]
    if path >= PATH_CHUNKED and not (Dk % 8 == 0 and Dv % 8 == 0 and Dk <= 128 and Dv <= 128):
        raise GdnExportError(f"cuda backend: the chunked path needs Dk, Dv multiples of 8 and <= 128, got {Dk}, {Dv}")
    if path in PATH_CHUNKED_WALK.values() and v.dtype not in (torch.float16, torch.bfloat16):
        raise GdnExportError(f"cuda backend: the mma.sync walk takes fp16 / bf16 inputs, got {v.dtype}")


def _extension_gdr(*args):
    """The extension's gated_delta_rule, its problem (it returns one rather than raising: see
    extension.cpp) raised as a one-line error."""
    out, problem = extension.load().gated_delta_rule(*args)
    if problem:
        raise GdnExportError(f"cuda backend: {problem}")
    return out


def gated_delta_rule(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens, path=PATH_AUTO,
                     smem_limit=0):
    """Returns fresh o [B, T, Hv, Dv] (v's dtype) and final_state [N, Hv, Dk, Dv] in the state's
    storage dtype (initial_state's; fp32 for None), rounded once at the end. path and smem_limit
    (tests, benchmarks): see _check_path."""
    out_dtype = v.dtype
    q, k, v, g, beta, cu_seqlens = _gdr_args(q, k, v, g, beta, initial_state, cu_seqlens)
    _check_path(path, q, v, smem_limit)
    if initial_state is not None:
        initial_state = initial_state.to(state_storage_dtype(initial_state)).contiguous()
    o, state = _extension_gdr(q, k, v, g, beta, initial_state, float(scale), bool(use_qk_l2norm), cu_seqlens,
                              None, None, path, int(smem_limit))
    return o.to(out_dtype), state


def gated_delta_rule_steps(q, k, v, g, beta, initial_state, scale, use_qk_l2norm):
    """gdn::gated_delta_rule_steps in one launch of the recurrent kernel: o [B, T, Hv, Dv] (v's
    dtype) and states [B, T, Hv, Dk, Dv] in the state's storage dtype, each token's state rounded to
    it and the next token started from the rounded value (gdn_export.ops.gated_delta_rule.steps)."""
    out_dtype = v.dtype
    q, k, v, g, beta, _ = _gdr_args(q, k, v, g, beta, initial_state, None)
    if initial_state is not None:
        initial_state = initial_state.to(state_storage_dtype(initial_state)).contiguous()
    o, states = _extension_gdr(q, k, v, g, beta, initial_state, float(scale), bool(use_qk_l2norm), None,
                               None, None, PATH_AUTO, 0, True)
    return o.to(out_dtype), states


def gated_delta_rule_out(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens, o, final_state,
                         path=PATH_AUTO, smem_limit=0):
    """Writes into the given o and final_state (final_state may be initial_state: in place); the
    state's storage dtype is final_state's (fp32, fp16 or bf16), initial_state must share it."""
    q, k, v, g, beta, cu_seqlens = _gdr_args(q, k, v, g, beta, initial_state, cu_seqlens)
    _check_path(path, q, v, smem_limit)
    B, T, _, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    check_out("o", o, (B, T, Hv, Dv), v.dtype, v.device)
    state_dtype = final_state.dtype if final_state.dtype in STATE_DTYPES else torch.float32
    check_out("final_state", final_state, (N, Hv, Dk, Dv), state_dtype, v.device)
    if initial_state is not None:
        check_out("initial_state", initial_state, (N, Hv, Dk, Dv), state_dtype, v.device)
    _extension_gdr(q, k, v, g, beta, initial_state, float(scale), bool(use_qk_l2norm), cu_seqlens,
                   o, final_state, path, int(smem_limit))
    return o, final_state


def gated_delta_rule_inplace(q, k, v, g, beta, state, scale, use_qk_l2norm, cu_seqlens=None):
    """Decode step that updates `state` [N, Hv, Dk, Dv] (fp32, fp16 or bf16, contiguous, CUDA) in
    place, rounding it once; returns o."""
    if state.dtype not in STATE_DTYPES or not state.is_contiguous():
        raise GdnExportError(f"in-place state must be contiguous float32, float16 or bfloat16, got {state.dtype}")
    o = torch.empty(v.shape, dtype=compute_dtype(v.dtype, "v"), device=v.device)
    gated_delta_rule_out(q, k, v, g, beta, state, scale, use_qk_l2norm, cu_seqlens, o, state)
    return o.to(v.dtype)


# ---------------------------------------------------------------- fast entries (the public ops' eager path)
# A decode step's kernel takes a few microseconds, less than the checked entries above spend in
# Python (their checks, casts and copies: ~26 us a call on the H200's host). Where the inputs
# need no cast, the extension's own checks (every shape, dtype, device and layout; extension.cpp)
# stand in for the Python ones: the fast entries test dtypes only, call the extension, and return
# None where the checked entry must run instead (a cast, or a problem the extension reported, which
# the checked entry then names in its one-line error).


def _fast_dtypes_ok(q, k, v, g, beta, state, cu_seqlens) -> bool:
    dt = v.dtype
    return (
        (dt is torch.bfloat16 or dt is torch.float16 or dt is torch.float32)
        and q.dtype is dt and k.dtype is dt and beta.dtype is dt and g.dtype is torch.float32
        and (state is None or state.dtype is torch.float32 or state.dtype is torch.bfloat16
             or state.dtype is torch.float16)
        and (cu_seqlens is None or cu_seqlens.dtype is torch.int32)
    )


def _contiguous(x):
    # the model's q, k, v are views of one projection: the copies the checked entry would make
    return x if x.is_contiguous() else x.contiguous()


def gated_delta_rule_fast(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens):
    """gated_delta_rule for inputs that need no cast (q, k, beta in v's dtype, g fp32, the state
    fp32 / fp16 / bf16 and contiguous, cu_seqlens int32), else None. scale: a float."""
    module = extension.loaded()
    if module is None or not _fast_dtypes_ok(q, k, v, g, beta, initial_state, cu_seqlens):
        return None
    out, problem = module.gated_delta_rule(_contiguous(q), _contiguous(k), _contiguous(v), _contiguous(g),
                                           _contiguous(beta), initial_state, scale, use_qk_l2norm, cu_seqlens)
    return None if problem else (out[0], out[1])


def gated_delta_rule_inplace_fast(q, k, v, g, beta, state, scale, use_qk_l2norm):
    """gated_delta_rule_inplace under gated_delta_rule_fast's conditions (state contiguous), else None."""
    module = extension.loaded()
    if module is None or not _fast_dtypes_ok(q, k, v, g, beta, state, None):
        return None
    out, problem = module.gated_delta_rule(_contiguous(q), _contiguous(k), _contiguous(v), _contiguous(g),
                                           _contiguous(beta), state, scale, use_qk_l2norm, None, None, state)
    return None if problem else out[0]
