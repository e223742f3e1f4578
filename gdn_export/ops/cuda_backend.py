"""The `cuda` backend of the gdn ops (see gdn_export.ops.backends for the contract): our CUDA kernels
(kernels/<op>/cuda/*.cu, the sources the TensorRT plugins compile too) as one PyTorch extension, built on first
use by gdn_export.cuda.extension. Each op's wrappers live beside the op (gdn_export/ops/<op>/cuda.py);
this module gathers the entries the registry looks up. Tensors must be on a CUDA device.
"""

from __future__ import annotations

from gdn_export.ops.causal_conv1d.cuda import causal_conv1d
from gdn_export.ops.gated_delta_rule.cuda import (gated_delta_rule, gated_delta_rule_fast, gated_delta_rule_inplace,
                                                  gated_delta_rule_inplace_fast, gated_delta_rule_steps)
from gdn_export.ops.moe.cuda import moe

__all__ = ["causal_conv1d", "gated_delta_rule", "gated_delta_rule_fast", "gated_delta_rule_inplace",
           "gated_delta_rule_inplace_fast", "gated_delta_rule_steps", "moe"]
