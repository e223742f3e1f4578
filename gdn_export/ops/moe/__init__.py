"""`gdn::moe`: the whole contract of the sparse mixture-of-experts op (routed experts only).

Each token runs through its top-k experts only; the shared expert and its gate stay standard
layers around the op. Same argument order in the fp32 reference (`naive.py`), the Triton kernels
(`kernels.moe.triton.moe`), the CUDA kernels (kernels/moe/cuda/moeKernels.h), the ONNX node (`onnx.py`)
and the TensorRT plugin fields.

    inputs                                   outputs
    0 hidden         [N, H]       T          0 out  [N, H]  T
    1 router_logits  [N, E]       R
    2 gate_up        [E, 2I, H]   W          (rows 0..I-1 gate, I..2I-1 up: transformers 5 layout)
    3 down           [E, H, I]    W

    T, R, W are fp32, fp16 or bf16 (the ONNX node and the plugin take one dtype T for all four).
    fields: top_k (int32, 1..E), norm_topk_prob (int32 0/1)

Routing, as transformers' Qwen3NextTopKRouter / Qwen3_5MoeTopKRouter: p = softmax(logits) in fp32,
the k largest p (exact ties may be broken differently by
each implementation: lower index first in ONNX, Triton and CUDA), divided by their sum when norm_topk_prob, then

    out[n] = sum_{j < k} w[n, j] * down[e_j] @ (silu(gate_up[e_j, :I] @ x_n) * (gate_up[e_j, I:] @ x_n))

Every implementation reads only the routed experts' weights: at decode (N * k < E) the cost is
that of the k * N expert slices, not of all E experts.

ONNX: one gdn.MoE node. ONNX Runtime runs it through a model-local function body in standard
ONNX rather than a compiled custom op (stock ORT, the exported file stays what TensorRT parses),
written so that its cost follows top-k: a Loop over the hit experts only (see onnx.py).
TensorRT plugin twin: plugins/moePlugin (kMOE_PLUGIN_NAME / VERSION / NAMESPACE).

Quantized experts (FP8 / INT4 weights): gdn::moe_fp8 / gdn::moe_int4, an op of their own in
gdn_export/ops/moe_quant/ (ONNX: DequantizeLinear into this node).
"""

from __future__ import annotations

import math

import torch

from gdn_export.ops import backends

OP_NAME = "gdn::moe"
# ONNX node and TensorRT plugin identity; must match plugins/moePlugin/moePlugin.h.
ONNX_DOMAIN = "gdn"
PLUGIN_NAME = "MoE"
PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = "gdn"
INPUT_NAMES = ("hidden", "router_logits", "gate_up", "down")
OUTPUT_NAMES = ("out",)
FIELD_TOP_K = "top_k"  # int32
FIELD_NORM_TOPK_PROB = "norm_topk_prob"  # int32 0/1

_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_inputs(hidden, router_logits, gate_up, down, top_k) -> None:
    """Raise ValueError naming the tensor (or top_k) that breaks the contract, in one line."""
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [N, H], got {tuple(hidden.shape)}")
    N, H = hidden.shape
    if router_logits.dim() != 2 or router_logits.shape[0] != N:
        raise ValueError(f"router_logits must be [N={N}, E], got {tuple(router_logits.shape)}")
    E = router_logits.shape[1]
    if gate_up.dim() != 3 or gate_up.shape[0] != E or gate_up.shape[2] != H or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must be [E={E}, 2I, H={H}], got {tuple(gate_up.shape)}")
    I = gate_up.shape[1] // 2
    if tuple(down.shape) != (E, H, I):
        raise ValueError(f"down must be [E, H, I] = {(E, H, I)}, got {tuple(down.shape)}")
    for name, t in (("hidden", hidden), ("router_logits", router_logits), ("gate_up", gate_up),
                    ("down", down)):
        if t.dtype not in _FLOATS:
            raise ValueError(f"{name} must be a floating tensor, got {t.dtype}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= E:
        raise ValueError(f"top_k must be an int in [1, E={E}], got {top_k!r}")


@torch.library.custom_op(OP_NAME, mutates_args=())
def _moe_op(
    hidden: torch.Tensor,
    router_logits: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    norm_topk_prob: bool,
) -> torch.Tensor:
    # Backend chosen here, where tensors are real (torch.export traces the fake below).
    out = backends.for_device(hidden.device).moe(hidden, router_logits, gate_up, down, top_k, norm_topk_prob)
    return out


@_moe_op.register_fake
def _(hidden, router_logits, gate_up, down, top_k, norm_topk_prob):
    return hidden.new_empty(hidden.shape)


def moe(
    hidden: torch.Tensor,
    router_logits: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    norm_topk_prob: bool = True,
) -> torch.Tensor:
    """Routed experts through the active backend (see module docstring for shapes).

    hidden [N, H], router_logits [N, E], gate_up [E, 2I, H], down [E, H, I] -> out [N, H] in
    hidden's dtype.
    """
    check_inputs(hidden, router_logits, gate_up, down, top_k)
    if backends.can_call_directly(hidden, router_logits, gate_up, down):  # eager: no dispatcher
        return backends.for_device(hidden.device).moe(hidden, router_logits, gate_up, down, int(top_k),
                                                      bool(norm_topk_prob))
    return torch.ops.gdn.moe(hidden, router_logits, gate_up, down, int(top_k), bool(norm_topk_prob))


def sparse_moe_forward(x: torch.Tensor, block) -> torch.Tensor:
    """A Qwen3-Next / Qwen3.5-MoE sparse MoE block through the op: routed experts + gated shared
    expert (what gdn_export.modules.mlp.SparseMoeBlock runs; transformers' blocks work too).

    x [..., H] -> [..., H]. `block` holds gate (Linear H -> E), experts.gate_up_proj [E, 2I, H],
    experts.down_proj [E, H, I], shared_expert (an MLP), shared_expert_gate (Linear H -> 1),
    top_k and norm_topk_prob (transformers' names: num_experts_per_tok also accepted). Experts
    with a `routed(x, logits, top_k, norm)` method (quantized experts: gdn_export.ops.moe_quant)
    run through it.
    """
    shape = x.shape
    flat = x.reshape(math.prod(shape[:-1]), shape[-1])  # no -1: one trace (gdn_export.onnx.one_trace)
    top_k = getattr(block, "top_k", None) or block.gate.top_k
    norm = getattr(block, "norm_topk_prob", getattr(block.gate, "norm_topk_prob", True))
    logits = torch.nn.functional.linear(flat, block.gate.weight)
    quantized = getattr(block.experts, "routed", None)  # gdn_export.modules.quant_experts
    if quantized is not None:
        routed = quantized(flat, logits, top_k, norm)
    else:
        routed = moe(flat, logits, block.experts.gate_up_proj, block.experts.down_proj, top_k, norm)
    shared = torch.sigmoid(block.shared_expert_gate(flat)) * block.shared_expert(flat)
    return (routed + shared).reshape(shape)
