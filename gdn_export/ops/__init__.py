"""The `gdn` custom ops, their golden references and the backend registry."""

from gdn_export.ops.backends import use_backend
from gdn_export.ops.causal_conv1d import causal_conv1d
from gdn_export.ops.gated_delta_rule import gated_delta_rule
from gdn_export.ops.moe import moe

__all__ = ["causal_conv1d", "gated_delta_rule", "moe", "use_backend"]
