"""`gdn::causal_conv1d`: the whole contract of the depthwise causal convolution op.

    inputs                                   outputs
    0 x           [B, T, C]    T             0 y               [B, T, C]    T
    1 weight      [C, K]       T             1 new_conv_state  [B, C, K-1]  T
    2 bias        [C]          T   (optional in torch; always present in ONNX)
    3 conv_state  [B, C, K-1]  T   (optional in torch; always present in ONNX)
    4 seq_lens    [B]          int32 (optional in torch = all T; always present in ONNX)

    T is fp32, fp16 or bf16. attribute: activation (int 0 = none, 1 = SiLU)

Ragged batches are right-padded: row b holds L_b = seq_lens[b] real tokens (0 <= L_b <= T), then
padding. y[b, t] for t < L_b is the usual causal conv; y at padded positions is unspecified but
finite. new_conv_state[b] is the last K-1 columns of [conv_state[b] | x[b, :L_b]], so L_b = 0
leaves the row's state unchanged. Lengths outside [0, T] raise ValueError where they can be read
on the host (CPU tensors); the GPU kernels (Triton, CUDA, the plugin) clamp them to [0, T].

In Python (the op, its backends, naive.py, the kernels' wrappers) seq_lens comes after silu, as
cu_seqlens does for the gated delta rule, so calls without it keep working; in ONNX and in the
plugin it is input 4.

TensorRT plugin twin: plugins/causalConv1dPlugin (kCONV_PLUGIN_NAME / VERSION / NAMESPACE).
"""

from __future__ import annotations

import torch

from gdn_export.ops import backends

OP_NAME = "gdn::causal_conv1d"
ONNX_DOMAIN = "gdn"
PLUGIN_NAME = "CausalConv1d"
PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = "gdn"
INPUT_NAMES = ("x", "weight", "bias", "conv_state", "seq_lens")
OUTPUT_NAMES = ("y", "new_conv_state")
FIELD_ACTIVATION = "activation"  # int32: 0 none, 1 SiLU
ACTIVATION_NONE, ACTIVATION_SILU = 0, 1


def check_inputs(x, weight, bias, conv_state, seq_lens=None) -> None:
    """Raise ValueError naming the tensor whose shape breaks the contract (values: check_lengths)."""
    if x.dim() != 3:
        raise ValueError(f"x must be [B, T, C], got {tuple(x.shape)}")
    B, T, C = x.shape
    if weight.dim() != 2 or weight.shape[0] != C or weight.shape[1] < 1:
        raise ValueError(f"weight must be [C={C}, K], got {tuple(weight.shape)}")
    K = weight.shape[1]
    if bias is not None and tuple(bias.shape) != (C,):
        raise ValueError(f"bias must be [C={C}], got {tuple(bias.shape)}")
    if conv_state is not None and tuple(conv_state.shape) != (B, C, K - 1):
        raise ValueError(f"conv_state must be [B, C, K-1] = {(B, C, K - 1)}, got {tuple(conv_state.shape)}")
    if seq_lens is None:
        return
    if tuple(seq_lens.shape) != (B,) or seq_lens.dtype.is_floating_point or seq_lens.dtype == torch.bool:
        raise ValueError(f"seq_lens must be integer [B={B}], got {seq_lens.dtype} {tuple(seq_lens.shape)}")


def check_lengths(seq_lens, T: int) -> None:
    """Raise ValueError for lengths outside [0, T] when seq_lens is a real CPU tensor (on a GPU the
    check would cost a sync, so the kernels clamp instead; under torch.export values are unknown)."""
    if seq_lens is None or seq_lens.device.type != "cpu" or seq_lens.numel() == 0:
        return
    if int(seq_lens.min()) < 0 or int(seq_lens.max()) > T:
        raise ValueError(f"seq_lens must lie in [0, T={T}], got {seq_lens.tolist()}")


@torch.library.custom_op(OP_NAME, mutates_args=())
def _causal_conv1d_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor | None,
    silu: bool,
    seq_lens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _run(x, weight, bias, conv_state, silu, seq_lens)


def _run(x, weight, bias, conv_state, silu, seq_lens):
    # Checked here, where tensors are real (torch.export traces the fake below).
    check_lengths(seq_lens, x.shape[1])
    y, state = backends.for_device(x.device).causal_conv1d(x, weight, bias, conv_state, silu, seq_lens)
    # The fake's (contiguous) strides: torch.compile checks them (the reference computes y as
    # [B, C, T] and returns a transposed view).
    return y.contiguous(), state.contiguous()


@_causal_conv1d_op.register_fake
def _(x, weight, bias, conv_state, silu, seq_lens):
    B, T, C = x.shape
    return x.new_empty(B, T, C), x.new_empty(B, C, weight.shape[1] - 1)


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    conv_state: torch.Tensor | None = None,
    silu: bool = True,
    seq_lens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv through the active backend (see the module docstring).

    seq_lens [B] int32 (other integer dtypes are cast): real tokens per right-padded row, or None
    for all T. Returns y [B, T, C] and new_conv_state [B, C, K-1], both in x's dtype.
    """
    check_inputs(x, weight, bias, conv_state, seq_lens)
    if seq_lens is not None:
        seq_lens = seq_lens.to(torch.int32)
    if backends.can_call_directly(x, weight, bias, conv_state, seq_lens):
        return _run(x, weight, bias, conv_state, bool(silu), seq_lens)  # eager: no dispatcher
    return torch.ops.gdn.causal_conv1d(x, weight, bias, conv_state, bool(silu), seq_lens)
