"""`gdn::causal_conv1d`: the whole contract of the depthwise causal convolution op.

    inputs                                   outputs
    0 x           [B, T, C]    T             0 y               [B, T, C]    T
    1 weight      [C, K]       T             1 new_conv_state  [B, C, K-1]  T
    2 bias        [C]          T   (optional in torch; always present in ONNX)
    3 conv_state  [B, C, K-1]  T   (optional in torch; always present in ONNX)

    T is fp32, fp16 or bf16. attribute: activation (int 0 = none, 1 = SiLU)

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
INPUT_NAMES = ("x", "weight", "bias", "conv_state")
OUTPUT_NAMES = ("y", "new_conv_state")
FIELD_ACTIVATION = "activation"  # int32: 0 none, 1 SiLU
ACTIVATION_NONE, ACTIVATION_SILU = 0, 1


def check_inputs(x, weight, bias, conv_state) -> None:
    """Raise ValueError naming the tensor whose shape breaks the contract."""
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


@torch.library.custom_op(OP_NAME, mutates_args=())
def _causal_conv1d_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor | None,
    silu: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    # Checked here, where tensors are real (torch.export traces the fake below).
    y, state = backends.for_device(x.device).causal_conv1d(x, weight, bias, conv_state, silu)
    return y, state


@_causal_conv1d_op.register_fake
def _(x, weight, bias, conv_state, silu):
    B, T, C = x.shape
    return x.new_empty(B, T, C), x.new_empty(B, C, weight.shape[1] - 1)


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    conv_state: torch.Tensor | None = None,
    silu: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv through the active backend.

    Returns y [B, T, C] and new_conv_state [B, C, K-1], both in x's dtype.
    """
    check_inputs(x, weight, bias, conv_state)
    return torch.ops.gdn.causal_conv1d(x, weight, bias, conv_state, bool(silu))
