"""The `triton` backend of the gdn ops (see gdn_export.ops.backends for the contract): the Triton
kernels of kernels/<op>/triton/. Each op's wrappers live beside the op (gdn_export/ops/<op>/triton.py);
this module gathers the entries the registry looks up. Tensors must be on a CUDA device, or on the
CPU under TRITON_INTERPRET=1.
"""

from __future__ import annotations

from gdn_export.ops.causal_conv1d.triton import causal_conv1d
from gdn_export.ops.gated_delta_rule.triton import (gated_delta_rule, gated_delta_rule_inplace,
                                                    gated_delta_rule_steps)
from gdn_export.ops.moe.triton import moe

__all__ = ["causal_conv1d", "gated_delta_rule", "gated_delta_rule_inplace", "gated_delta_rule_steps", "moe"]
