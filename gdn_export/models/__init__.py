"""The hybrid GDN + gated attention causal LM and its flat state interface."""

from gdn_export.models.cache import Cache, StateSpec
from gdn_export.models.hybrid import HybridForCausalLM

__all__ = ["Cache", "HybridForCausalLM", "StateSpec"]
