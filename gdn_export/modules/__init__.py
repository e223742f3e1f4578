"""Model building blocks of the hybrid GDN LMs; parameter names follow transformers' checkpoints.

Modules know nothing of ONNX or TensorRT: the GDN mixer calls the `gdn` custom ops, which export as
single nodes; everything else is plain PyTorch that exports to standard ONNX.
"""

from gdn_export.modules.gated_attention import GatedAttention
from gdn_export.modules.gated_deltanet import GatedDeltaNet
from gdn_export.modules.mlp import SparseMoeBlock, SwiGLUMLP
from gdn_export.modules.norm import GatedRMSNorm, ZeroCenteredRMSNorm
from gdn_export.modules.rotary import RotaryEmbedding, apply_rotary

__all__ = [
    "GatedAttention",
    "GatedDeltaNet",
    "GatedRMSNorm",
    "RotaryEmbedding",
    "SparseMoeBlock",
    "SwiGLUMLP",
    "ZeroCenteredRMSNorm",
    "apply_rotary",
]
