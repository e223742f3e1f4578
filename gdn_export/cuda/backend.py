"""The `cuda` backend: gdn ops through our CUDA kernels (see gdn_export.ops.backends).

Shapes (same argument order as the reference backend):
    gated_delta_rule(q [B, T, Hk, Dk], k [B, T, Hk, Dk], v [B, T, Hv, Dv], g [B, T, Hv],
                     beta [B, T, Hv], initial_state [N, Hv, Dk, Dv] S | None, scale,
                     use_qk_l2norm, cu_seqlens [N + 1] | None) -> (o [B, T, Hv, Dv], final_state S)
        S: the state's storage dtype, fp32, fp16 or bf16 (fp32 for None; float64 runs as fp32).
    causal_conv1d(x [B, T, C], weight [C, K], bias [C] | None, conv_state [B, C, K-1] | None, silu,
                  seq_lens [B] int32 | None) -> (y [B, T, C], new_conv_state [B, C, K-1])
    moe(hidden [N, H], router_logits [N, E], gate_up [E, 2I, H], down [E, H, I], top_k,
        norm_topk_prob) -> out [N, H]

Activations are fp32, fp16 or bf16 (q, k, beta are cast to v's dtype, g to fp32; float64 runs in
fp32 and is cast back). Tensors must be on a CUDA device. The `*_inplace` variants update the
given state tensor instead of returning a new one (decode without a copy).
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import torch

from gdn_export.errors import GdnExportError
from gdn_export.ops.causal_conv1d import check_inputs as _check_conv_inputs
from gdn_export.ops.gated_delta_rule import STATE_DTYPES
from gdn_export.ops.gated_delta_rule import check_inputs as _check_gdr_inputs
from gdn_export.ops.gated_delta_rule import state_storage_dtype
from gdn_export.ops.moe import check_inputs as _check_moe_inputs

PLUGINS_DIR = Path(__file__).resolve().parents[2] / "plugins"
SOURCES = (
    Path(__file__).resolve().parent / "extension.cpp",
    PLUGINS_DIR / "gatedDeltaRulePlugin" / "gatedDeltaRuleKernels.cu",
    PLUGINS_DIR / "causalConv1dPlugin" / "causalConv1dKernels.cu",
    PLUGINS_DIR / "moePlugin" / "moeKernels.cu",
)
# Headers the build depends on: a change to any of them must rebuild the extension.
_HEADERS = (
    PLUGINS_DIR / "common" / "floatConvert.cuh",
    PLUGINS_DIR / "common" / "mmaSync.cuh",
    PLUGINS_DIR / "gatedDeltaRulePlugin" / "gatedDeltaRuleKernels.h",
    PLUGINS_DIR / "gatedDeltaRulePlugin" / "gatedDeltaRuleKernelsDetail.h",
    PLUGINS_DIR / "gatedDeltaRulePlugin" / "gatedDeltaRuleCommon.cuh",
    PLUGINS_DIR / "gatedDeltaRulePlugin" / "gatedDeltaRuleRecurrent.cuh",
    PLUGINS_DIR / "gatedDeltaRulePlugin" / "gatedDeltaRuleChunk.cuh",
    PLUGINS_DIR / "gatedDeltaRulePlugin" / "gatedDeltaRuleChunkPrepare16.cuh",
    PLUGINS_DIR / "gatedDeltaRulePlugin" / "gatedDeltaRuleChunkWalk.cuh",
    PLUGINS_DIR / "causalConv1dPlugin" / "causalConv1dKernels.h",
    PLUGINS_DIR / "moePlugin" / "moeKernels.h",
    PLUGINS_DIR / "moePlugin" / "moeCommon.cuh",
    PLUGINS_DIR / "moePlugin" / "moeGemmSimt.cuh",
    PLUGINS_DIR / "moePlugin" / "moeGemmWmma.cuh",
)
BUILD_DIR_ENV = "GDN_EXPORT_CUDA_BUILD_DIR"
_ACTIVATIONS = (torch.float32, torch.float16, torch.bfloat16)
MAX_CONV_KERNEL = 8  # kMAX_K in causalConv1dKernels.cu
MAX_EXPERTS, MAX_TOP_K = 1024, 32  # kMAX_EXPERTS / kMAX_TOP_K in moeKernels.h
# Kernel path selector of the extension (tests and benchmarks pin one).
PATH_AUTO, PATH_RECURRENT, PATH_CHUNKED = 0, 1, 2
# The chunked path with its sequential pass pinned: the wmma walk, or the mma.sync walk (fp16 / bf16
# inputs) on 1, 2 or 4 warps a block (gdn::GatedDeltaRulePath).
PATH_CHUNKED_WMMA, PATH_CHUNKED_WALK = 3, {1: 4, 2: 5, 4: 6}
# Shared memory a block may use on the GPUs the chunked path is built for (bytes): tests and
# benchmarks pass one as smem_limit to run that GPU's kernel choices on a larger one.
SMEM_SM86 = 99 * 1024  # sm_86 / 89 / 120
SMEM_SM80 = 163 * 1024

_lock = threading.Lock()
_module = None


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def _build_dir(arch: str) -> Path:
    digest = hashlib.sha256()
    for path in SOURCES + _HEADERS:
        digest.update(path.read_bytes())
    tag = f"sm{arch.replace('.', '')}-torch{torch.__version__}-{digest.hexdigest()[:12]}"
    root = Path(os.environ.get(BUILD_DIR_ENV, Path.home() / ".cache" / "gdn_export" / "cuda_ext"))
    path = root / tag
    path.mkdir(parents=True, exist_ok=True)
    return path


def load():
    """The compiled extension, built on first call for the current GPU (minutes the first time)."""
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is not None:
            return _module
        try:
            if not torch.cuda.is_available():
                raise RuntimeError("no CUDA device is visible to PyTorch")
            from torch.utils import cpp_extension

            arch = _arch()
            os.environ.setdefault("TORCH_CUDA_ARCH_LIST", arch)
            # No -std flag: the binding includes torch headers and must use torch's own standard
            # (C++20 since torch 2.10); a -std=c++17 here made every TORCH_CHECK failure segfault.
            flags = ["-O3"]
            _module = cpp_extension.load(
                name="gdn_export_cuda_ext",
                sources=[str(s) for s in SOURCES],
                extra_include_paths=[str(PLUGINS_DIR)],
                extra_cflags=flags,
                extra_cuda_cflags=flags + ["--expt-relaxed-constexpr", "-lineinfo"],
                build_directory=str(_build_dir(arch)),
                verbose=bool(os.environ.get("GDN_EXPORT_CUDA_VERBOSE")),
            )
        except Exception as exc:  # a failed build or import: one clear line for the user
            raise GdnExportError(f"cuda backend unavailable: {type(exc).__name__}: {exc}".splitlines()[0]) from exc
    return _module


def _require_cuda(**tensors) -> None:
    for name, t in tensors.items():
        if t is not None and t.device.type != "cuda":
            raise GdnExportError(f"cuda backend needs CUDA tensors, got {name} on {t.device}")


def _compute_dtype(dtype: torch.dtype, name: str) -> torch.dtype:
    if dtype == torch.float64:
        return torch.float32
    if dtype not in _ACTIVATIONS:
        raise GdnExportError(f"cuda backend: {name} must be a floating tensor, got {dtype}")
    return dtype


def _check_out(name, t, shape, dtype, device) -> None:
    """An output buffer given by the caller: exact shape, dtype, device, contiguous."""
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.device != device or not t.is_contiguous():
        raise GdnExportError(
            f"cuda backend: {name} must be a contiguous {dtype} tensor of shape {tuple(shape)} on {device}, "
            f"got {t.dtype} {tuple(t.shape)} on {t.device}{'' if t.is_contiguous() else ' (not contiguous)'}"
        )


def _gdr_args(q, k, v, g, beta, initial_state, cu_seqlens):
    # Shapes are checked here, before the extension: its own checks are a second line of defence.
    try:
        _check_gdr_inputs(q, k, v, g, beta, initial_state, cu_seqlens)
    except ValueError as exc:
        raise GdnExportError(f"cuda backend: {exc}") from exc
    _require_cuda(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, cu_seqlens=cu_seqlens)
    dt = _compute_dtype(v.dtype, "v")
    q, k, v, beta = (x.to(dt).contiguous() for x in (q, k, v, beta))
    g = g.to(torch.float32).contiguous()
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.to(torch.int32).contiguous()
    return q, k, v, g, beta, cu_seqlens


def _check_path(path, q, v, smem_limit=0):
    """A pinned path the kernels would refuse, as a one-line error before the extension (whose failing
    checks have crashed the process on the H200 image; see tests/cuda/test_gated_delta_rule_cuda.py).
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
    out, problem = load().gated_delta_rule(*args)
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


def gated_delta_rule_out(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens, o, final_state,
                         path=PATH_AUTO, smem_limit=0):
    """Writes into the given o and final_state (final_state may be initial_state: in place); the
    state's storage dtype is final_state's (fp32, fp16 or bf16), initial_state must share it."""
    q, k, v, g, beta, cu_seqlens = _gdr_args(q, k, v, g, beta, initial_state, cu_seqlens)
    _check_path(path, q, v, smem_limit)
    B, T, _, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    _check_out("o", o, (B, T, Hv, Dv), v.dtype, v.device)
    state_dtype = final_state.dtype if final_state.dtype in STATE_DTYPES else torch.float32
    _check_out("final_state", final_state, (N, Hv, Dk, Dv), state_dtype, v.device)
    if initial_state is not None:
        _check_out("initial_state", initial_state, (N, Hv, Dk, Dv), state_dtype, v.device)
    _extension_gdr(q, k, v, g, beta, initial_state, float(scale), bool(use_qk_l2norm), cu_seqlens,
                   o, final_state, path, int(smem_limit))
    return o, final_state


def gated_delta_rule_inplace(q, k, v, g, beta, state, scale, use_qk_l2norm, cu_seqlens=None):
    """Decode step that updates `state` [N, Hv, Dk, Dv] (fp32, fp16 or bf16, contiguous, CUDA) in
    place, rounding it once; returns o."""
    if state.dtype not in STATE_DTYPES or not state.is_contiguous():
        raise GdnExportError(f"in-place state must be contiguous float32, float16 or bfloat16, got {state.dtype}")
    o = torch.empty(v.shape, dtype=_compute_dtype(v.dtype, "v"), device=v.device)
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
    if _module is None or not _fast_dtypes_ok(q, k, v, g, beta, initial_state, cu_seqlens):
        return None
    out, problem = _module.gated_delta_rule(_contiguous(q), _contiguous(k), _contiguous(v), _contiguous(g),
                                            _contiguous(beta), initial_state, scale, use_qk_l2norm, cu_seqlens)
    return None if problem else (out[0], out[1])


def gated_delta_rule_inplace_fast(q, k, v, g, beta, state, scale, use_qk_l2norm):
    """gated_delta_rule_inplace under gated_delta_rule_fast's conditions (state contiguous), else None."""
    if _module is None or not _fast_dtypes_ok(q, k, v, g, beta, state, None):
        return None
    out, problem = _module.gated_delta_rule(_contiguous(q), _contiguous(k), _contiguous(v), _contiguous(g),
                                            _contiguous(beta), state, scale, use_qk_l2norm, None, None, state)
    return None if problem else out[0]


def _conv_args(x, weight, bias, conv_state, seq_lens=None):
    try:
        _check_conv_inputs(x, weight, bias, conv_state, seq_lens)
    except ValueError as exc:
        raise GdnExportError(f"cuda backend: {exc}") from exc
    if weight.shape[1] > MAX_CONV_KERNEL:
        raise GdnExportError(f"cuda backend: conv kernel size must be 1..{MAX_CONV_KERNEL}, got {weight.shape[1]}")
    _require_cuda(x=x, weight=weight, bias=bias, conv_state=conv_state, seq_lens=seq_lens)
    dt = _compute_dtype(x.dtype, "x")
    cast = lambda t: None if t is None else t.to(dt).contiguous()  # noqa: E731
    lens = None if seq_lens is None else seq_lens.to(torch.int32).contiguous()
    return cast(x), cast(weight), cast(bias), cast(conv_state), lens


def causal_conv1d(x, weight, bias, conv_state, silu, seq_lens=None):
    """Returns fresh y [B, T, C] and new_conv_state [B, C, K-1], both in x's dtype. seq_lens [B]
    (right-padded rows, None = all T) is clamped to [0, T] by the kernel."""
    out_dtype = x.dtype
    x, weight, bias, conv_state, seq_lens = _conv_args(x, weight, bias, conv_state, seq_lens)
    y, state = load().causal_conv1d(x, weight, bias, conv_state, bool(silu), None, None, seq_lens)
    return y.to(out_dtype), state.to(out_dtype)


def causal_conv1d_out(x, weight, bias, conv_state, silu, y, new_conv_state, seq_lens=None):
    """Writes into y and new_conv_state (which may be conv_state itself)."""
    x, weight, bias, _, seq_lens = _conv_args(x, weight, bias, conv_state, seq_lens)
    B, T, C = x.shape
    K = weight.shape[1]
    _check_out("y", y, (B, T, C), x.dtype, x.device)
    _check_out("new_conv_state", new_conv_state, (B, C, K - 1), x.dtype, x.device)
    if conv_state is not None:
        _check_out("conv_state", conv_state, (B, C, K - 1), x.dtype, x.device)
    load().causal_conv1d(x, weight, bias, conv_state, bool(silu), y, new_conv_state, seq_lens)
    return y, new_conv_state


def causal_conv1d_inplace(x, weight, bias, conv_state, silu, seq_lens=None):
    """Convolution step that updates `conv_state` [B, C, K-1] (x's dtype, contiguous) in place; returns y."""
    if conv_state.dtype != x.dtype or not conv_state.is_contiguous():
        raise GdnExportError(f"in-place conv_state must be contiguous {x.dtype}, got {conv_state.dtype}")
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    causal_conv1d_out(x, weight, bias, conv_state, silu, y, conv_state, seq_lens)
    return y


def moe(hidden, router_logits, gate_up, down, top_k, norm_topk_prob):
    """Returns out [N, H] in hidden's dtype. All four tensors run in hidden's dtype (fp64 in fp32):
    weights in another dtype are cast, which reads every expert: keep them in hidden's dtype."""
    try:
        _check_moe_inputs(hidden, router_logits, gate_up, down, top_k)
    except ValueError as exc:
        raise GdnExportError(f"cuda backend: {exc}") from exc
    E = router_logits.shape[1]
    if E > MAX_EXPERTS or top_k > MAX_TOP_K:
        raise GdnExportError(f"cuda backend: moe supports E <= {MAX_EXPERTS} and top_k <= {MAX_TOP_K}, "
                             f"got E={E}, top_k={top_k}")
    _require_cuda(hidden=hidden, router_logits=router_logits, gate_up=gate_up, down=down)
    dt = _compute_dtype(hidden.dtype, "hidden")
    args = [t if t.dtype == dt and t.is_contiguous() else t.to(dt).contiguous()
            for t in (hidden, router_logits, gate_up, down)]
    return load().moe(*args, int(top_k), bool(norm_topk_prob)).to(hidden.dtype)
