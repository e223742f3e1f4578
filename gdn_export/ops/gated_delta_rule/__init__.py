"""`gdn::gated_delta_rule`: the whole contract of the gated delta rule op.

One op serves decode (T = 1) and prefill (T > 1). The same argument order is used by the fp32
reference (`naive.py`), the Triton kernels (kernels/gated_delta_rule/triton/, entered through
`triton.py`), the CUDA kernels (kernels/gated_delta_rule/cuda/, entered through `cuda.py`), the
ONNX node (`onnx.py`) and the TensorRT plugin fields.

    inputs                                   outputs
    0 q              [B, T, Hk, Dk]  T       0 o            [B, T, Hv, Dv]  T
    1 k              [B, T, Hk, Dk]  T       1 final_state  [N, Hv, Dk, Dv] S
    2 v              [B, T, Hv, Dv]  T
    3 g              [B, T, Hv]      fp32    (log decay, <= 0)
    4 beta           [B, T, Hv]      T       (write strength, in (0, 2))
    5 initial_state  [N, Hv, Dk, Dv] S       (optional in torch; always present in ONNX)

    T is fp32, fp16 or bf16. Hv is a multiple of Hk: value head h reads key head h // (Hv // Hk).
    S, the storage dtype of the recurrent state, is fp32, fp16 or bf16, independent of T:
    initial_state's dtype (a float64 initial_state counts as fp32), fp32 when it is None (the
    Python wrapper's `state_dtype` picks another one by passing zeros of that dtype).
    N = B, or the number of packed sequences when cu_seqlens [N + 1] is given (then B = 1).
    attributes: scale (float), use_qk_l2norm (int 0/1)

Rounding rule of a 16-bit state (the same in every implementation: references, Triton, CUDA,
ONNX function, plugin): one call reads the stored state and converts it to fp32 (exact), does all
its arithmetic in fp32 over all its T tokens (the state stays fp32 across the chunks of a prefill
and across the steps of a short prompt), and rounds the state to S once, round-to-nearest-even,
where it stores final_state. A decode step (T = 1) therefore rounds once per token; a prefill of T
tokens once per call (per sequence when packed). The kernels keep the state on-chip for the whole
call, so this costs no extra traffic; a 16-bit state halves the bytes a decode step moves.

beta is (0, 1) from a sigmoid in Qwen3-Next / Qwen3.5 and up to 2 with OLMo-Hybrid's
allow_neg_eigval (eigenvalues of I - beta k k^T in (-1, 1) for unit keys); every backend is tested
on the whole of (0, 2) against the fp32 reference.

Ragged batches are right-padded: at padded positions the model writes g = 0 and beta = 0, a step
that leaves the state exactly unchanged (S <- 1 * S + 0), so each row's final state is the state
after its last real token; o at padded positions is meaningless. cu_seqlens packs of padded rows
obey the same rule. Tested on every backend (tests/contracts/gated_delta_rule, the padded cases).

TensorRT plugin twin: plugins/gatedDeltaRulePlugin (kGDR_PLUGIN_NAME / VERSION / NAMESPACE).
"""

from __future__ import annotations

import torch

from gdn_export.ops import backends

OP_NAME = "gdn::gated_delta_rule"
# ONNX node and TensorRT plugin identity; must match plugins/gatedDeltaRulePlugin.
ONNX_DOMAIN = "gdn"
PLUGIN_NAME = "GatedDeltaRule"
PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = "gdn"
INPUT_NAMES = ("q", "k", "v", "g", "beta", "initial_state")
OUTPUT_NAMES = ("o", "final_state")
FIELD_SCALE = "scale"  # float32
FIELD_USE_QK_L2NORM = "use_qk_l2norm"  # int32 0/1

_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# Storage dtypes of the recurrent state (initial_state / final_state); math is fp32 regardless.
STATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def state_storage_dtype(initial_state: torch.Tensor | None) -> torch.dtype:
    """The dtype final_state is returned in: initial_state's (float64 -> fp32), fp32 for None."""
    if initial_state is None or initial_state.dtype == torch.float64:
        return torch.float32
    return initial_state.dtype


def check_inputs(q, k, v, g, beta, initial_state, cu_seqlens) -> None:
    """Raise ValueError naming the tensor whose shape or dtype breaks the contract."""
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must both be [B, T, Hk, Dk], got q {tuple(q.shape)} k {tuple(k.shape)}")
    B, T, Hk, Dk = q.shape
    if v.dim() != 4 or v.shape[:2] != (B, T):
        raise ValueError(f"v must be [B={B}, T={T}, Hv, Dv], got {tuple(v.shape)}")
    Hv, Dv = v.shape[2], v.shape[3]
    if Hv % Hk:
        raise ValueError(f"value heads ({Hv}) must be a multiple of key heads ({Hk})")
    for name, t in (("g", g), ("beta", beta)):
        if tuple(t.shape) != (B, T, Hv):
            raise ValueError(f"{name} must be [B, T, Hv] = {(B, T, Hv)}, got {tuple(t.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if t.dtype not in _FLOATS:
            raise ValueError(f"{name} must be a floating tensor, got {t.dtype}")
    N = B
    if cu_seqlens is not None:
        if B != 1 or cu_seqlens.dim() != 1:
            raise ValueError(f"cu_seqlens needs B = 1 and shape [N + 1], got B={B}, {tuple(cu_seqlens.shape)}")
        N = cu_seqlens.shape[0] - 1
    if initial_state is not None and tuple(initial_state.shape) != (N, Hv, Dk, Dv):
        raise ValueError(f"initial_state must be [N, Hv, Dk, Dv] = {(N, Hv, Dk, Dv)}, got {tuple(initial_state.shape)}")
    if initial_state is not None and initial_state.dtype not in STATE_DTYPES + (torch.float64,):
        raise ValueError(f"initial_state must be float32, float16 or bfloat16, got {initial_state.dtype}")


@torch.library.custom_op(OP_NAME, mutates_args=())
def _gated_delta_rule_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    scale: float,
    use_qk_l2norm: bool,
    cu_seqlens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _run(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens)


def _run(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens):
    # The device is checked here, where tensors are real: torch.export traces the fake below, so
    # exporting a CPU model with GDN_EXPORT_BACKEND=triton set still works.
    return backends.for_device(v.device).gated_delta_rule(
        q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens
    )


@_gated_delta_rule_op.register_fake
def _(q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens):
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return v.new_empty(B, T, Hv, Dv), v.new_empty(N, Hv, Dk, Dv, dtype=state_storage_dtype(initial_state))


INPLACE_OP_NAME = "gdn::gated_delta_rule_"


@torch.library.custom_op(INPLACE_OP_NAME, mutates_args=("state",))
def _gated_delta_rule_inplace_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
    use_qk_l2norm: bool,
) -> torch.Tensor:
    return _run_inplace(q, k, v, g, beta, state, scale, use_qk_l2norm)


def _run_inplace(q, k, v, g, beta, state, scale, use_qk_l2norm):
    backend = backends.for_device(v.device)
    # The state keeps its storage dtype either way (the kernels read and round it themselves).
    if backend.gated_delta_rule_inplace is not None and state.dtype in STATE_DTYPES \
            and state.is_contiguous():
        return backend.gated_delta_rule_inplace(q, k, v, g, beta, state, scale, use_qk_l2norm)
    o, new_state = backend.gated_delta_rule(q, k, v, g, beta, state, scale, use_qk_l2norm, None)
    state.copy_(new_state)
    return o


@_gated_delta_rule_inplace_op.register_fake
def _(q, k, v, g, beta, state, scale, use_qk_l2norm):
    return torch.empty_like(v)


def gated_delta_rule_(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
) -> torch.Tensor:
    """`gated_delta_rule` that writes the final state over `state` [B, Hv, Dk, Dv] (no cu_seqlens)
    and returns o. An eager / CUDA-graph fast path (gdn_export.runtime.cuda_graph): backends with an
    in-place kernel (triton, cuda) update the fp32 state where it lies, the others copy it back. Not
    an ONNX node: exported graphs use the functional op."""
    if q.dim() == 4 and backends.can_call_directly(q, k, v, g, beta, state):
        backend = backends.loaded_for(v.device)
        if backend is not None and backend.gated_delta_rule_inplace_fast is not None:
            o = backend.gated_delta_rule_inplace_fast(
                q, k, v, g, beta, state, q.shape[-1] ** -0.5 if scale is None else float(scale), bool(use_qk_l2norm)
            )
            if o is not None:
                return o
    check_inputs(q, k, v, g, beta, state, None)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if backends.can_call_directly(q, k, v, g, beta, state):
        return _run_inplace(q, k, v, g, beta, state, scale, bool(use_qk_l2norm))
    return torch.ops.gdn.gated_delta_rule_(q, k, v, g, beta, state, scale, bool(use_qk_l2norm))


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    state_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated delta rule through the active backend (see module docstring for shapes).

    state_dtype: storage dtype of the state (fp32, fp16 or bf16) when initial_state is None (a
    zero state of that dtype is passed to the op); with an initial_state it must be None or that
    tensor's dtype. Returns o [B, T, Hv, Dv] in v's dtype and final_state [N, Hv, Dk, Dv] in the
    state's storage dtype (initial_state's, else state_dtype, else fp32).
    """
    if state_dtype is None and q.dim() == 4 and backends.can_call_directly(q, k, v, g, beta, initial_state,
                                                                         cu_seqlens):
        # Eager, on a backend with a fast entry (cuda): no Python checks unless it declines.
        backend = backends.loaded_for(v.device)
        if backend is not None and backend.gated_delta_rule_fast is not None:
            out = backend.gated_delta_rule_fast(
                q, k, v, g, beta, initial_state, q.shape[-1] ** -0.5 if scale is None else float(scale),
                bool(use_qk_l2norm), cu_seqlens,
            )
            if out is not None:
                return out
    check_inputs(q, k, v, g, beta, initial_state, cu_seqlens)
    if state_dtype is not None:
        if state_dtype not in STATE_DTYPES:
            raise ValueError(f"state_dtype must be float32, float16 or bfloat16, got {state_dtype}")
        if initial_state is not None and initial_state.dtype != state_dtype:
            raise ValueError(f"initial_state is {initial_state.dtype} but state_dtype is {state_dtype}")
        if initial_state is None and state_dtype != torch.float32:
            N = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
            initial_state = v.new_zeros(N, v.shape[2], q.shape[3], v.shape[3], dtype=state_dtype)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if backends.can_call_directly(q, k, v, g, beta, initial_state, cu_seqlens):
        # Eager: straight to the backend (no dispatcher overhead); traced: the op's one node.
        return _run(q, k, v, g, beta, initial_state, scale, bool(use_qk_l2norm), cu_seqlens)
    return torch.ops.gdn.gated_delta_rule(
        q, k, v, g, beta, initial_state, scale, bool(use_qk_l2norm), cu_seqlens
    )
