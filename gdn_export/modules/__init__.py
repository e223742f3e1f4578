"""Model building blocks of the hybrid GDN LMs; parameter names follow transformers' checkpoints.

Modules know nothing of ONNX or TensorRT: the GDN mixer calls the `gdn` custom ops, which export as
single nodes; everything else is plain PyTorch that exports to standard ONNX.
"""

from gdn_export.modules.gated_attention import GatedAttention
from gdn_export.modules.gated_deltanet import GatedDeltaNet
from gdn_export.modules.mlp import MoeExperts, SparseMoeBlock, SwiGLUMLP
from gdn_export.modules.norm import GatedRMSNorm, RMSNorm, ZeroCenteredRMSNorm, make_rmsnorm
from gdn_export.modules.olmo_hybrid import OlmoAttention, OlmoGatedDeltaNet
from gdn_export.modules.rotary import RotaryEmbedding, apply_rotary

__all__ = [
    "GatedAttention",
    "GatedDeltaNet",
    "GatedRMSNorm",
    "MoeExperts",
    "OlmoAttention",
    "OlmoGatedDeltaNet",
    "RMSNorm",
    "RotaryEmbedding",
    "SparseMoeBlock",
    "SwiGLUMLP",
    "ZeroCenteredRMSNorm",
    "apply_rotary",
    "make_rmsnorm",
]
