"""metadata_props written into every exported file, so runtimes need nothing but the .onnx.

    gdn_export.version      gdn-export version that wrote the file
    gdn_export.family       model family ("qwen3_next" | "qwen3_5" | "qwen3_5_moe" | "olmo_hybrid")
    gdn_export.dtype        model dtype ("float32" | "float16" | "bfloat16")
    gdn_export.opset        ai.onnx opset of the graph
    gdn_export.vocab_size   logits width V
    gdn_export.state_specs  JSON list, in graph order, of
                            {"name": "past.3.key", "output": "present.3.key",
                             "shape": ["batch", 2, 4096, 64], "dtype": "float16",
                             "layer": 3, "kind": "key"}
    gdn_export.kv_cache     "inplace" | "concat" (gdn_export.layout)
    gdn_export.cache_len    K/V slots per attention layer (inplace)
    gdn_export.attention_sinks / gdn_export.attention_window   streaming (0 / 0: off)
    gdn_export.logits       "last" (logits [batch, 1, V]) | "all" ([batch, seq, V])
    gdn_export.state_dtype  recurrent state dtype ("float32" | "bfloat16" | "float16")
    gdn_export.quantization "none" | "fp8" (FP8 Q/DQ, weights per channel, activations per tensor) |
                            "fp8-block128" (published FP8: blockwise weight DQ, 16-bit activations) |
                            "int4-awq" (INT4 weights, blockwise DQ of 128, 16-bit activations);
                            a comma-separated list when a model mixes them
    gdn_export.kv_cache_format  "fp8" (only with an FP8 K/V cache: past / present.*.key / value
                            FLOAT8E4M3FN, QuantizeLinear before TensorScatter, DequantizeLinear after it)
    gdn_export.kv_cache_scales  JSON {"layer": [k_scale, v_scale]} of that cache (the graph's Q/DQ
                            scale initializers; absent without an FP8 cache)

Files written before these keys existed are the concat layout with all logits and fp32 states.
A file without gdn_export.version is not ours: `build` refuses it (gdn_export.trt.build.check_exported).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

PREFIX = "gdn_export."
KEY_VERSION = PREFIX + "version"
KEY_FAMILY = PREFIX + "family"
KEY_DTYPE = PREFIX + "dtype"
KEY_OPSET = PREFIX + "opset"
KEY_VOCAB = PREFIX + "vocab_size"
KEY_STATES = PREFIX + "state_specs"
KEY_KV_CACHE = PREFIX + "kv_cache"
KEY_CACHE_LEN = PREFIX + "cache_len"
KEY_SINKS = PREFIX + "attention_sinks"
KEY_WINDOW = PREFIX + "attention_window"
KEY_LOGITS = PREFIX + "logits"
KEY_STATE_DTYPE = PREFIX + "state_dtype"
KEY_QUANTIZATION = PREFIX + "quantization"
KEY_KV_CACHE_FORMAT = PREFIX + "kv_cache_format"
KEY_KV_CACHE_SCALES = PREFIX + "kv_cache_scales"
VLM_PREFIX = PREFIX + "vlm."  # the keys of a vision-language export (gdn_export.vlm.export)
KEY_VLM_ROLE = VLM_PREFIX + "role"  # "language" | "vision"
KEY_SPECULATIVE_ROLE = PREFIX + "speculative"  # "verify" | "mtp": the graphs of `export --speculative K`
KEY_SPECULATIVE_K = PREFIX + "speculative_k"


def kv_cache_metadata(scales: dict | None) -> dict[str, str]:
    """The FP8 K/V cache keys for scales {layer: (k_scale, v_scale)}; {} for a model-dtype cache
    (files without an FP8 cache carry neither key)."""
    if not scales:
        return {}
    return {KEY_KV_CACHE_FORMAT: "fp8",
            KEY_KV_CACHE_SCALES: json.dumps({str(i): [k, v] for i, (k, v) in sorted(scales.items())})}


@dataclass(frozen=True)
class StateLayout:
    """One state tensor as recorded in the file; dtype is a numpy-style name ("float32")."""

    name: str
    output: str
    shape: tuple[int | str, ...]
    dtype: str
    layer: int
    kind: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "output": self.output, "shape": list(self.shape),
                "dtype": self.dtype, "layer": self.layer, "kind": self.kind}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "StateLayout":
        return cls(d["name"], d["output"], tuple(d["shape"]), d["dtype"], int(d["layer"]), d["kind"])


def torch_dtype_name(dtype) -> str:
    """torch.float16 -> "float16"."""
    return str(dtype).removeprefix("torch.")


def layouts_from_specs(specs: Sequence) -> list[StateLayout]:
    """StateLayouts from the model's `state_specs()` (gdn_export.models.cache.StateSpec)."""
    return [StateLayout(s.name, s.output_name, tuple(s.shape), torch_dtype_name(s.dtype), s.layer,
                        s.kind) for s in specs]


def quantization_name(formats) -> str:
    """The gdn_export.quantization value of a model whose quantized layers have `formats`."""
    return ",".join(sorted(formats)) or "none"


def make_metadata(*, version: str, family: str, dtype: str, opset: int, vocab_size: int,
                  states: Sequence[StateLayout], layout, quantization: str = "none") -> dict[str, str]:
    """The metadata_props entries (all strings) of an exported file; `layout` is the model's
    gdn_export.layout.DeployLayout."""
    return {
        KEY_VERSION: version,
        KEY_FAMILY: family,
        KEY_DTYPE: dtype,
        KEY_OPSET: str(opset),
        KEY_VOCAB: str(vocab_size),
        KEY_STATES: json.dumps([s.to_json() for s in states]),
        KEY_KV_CACHE: layout.kv_cache,
        KEY_CACHE_LEN: str(layout.cache_len),
        KEY_SINKS: str(layout.sinks),
        KEY_WINDOW: str(layout.window),
        KEY_LOGITS: layout.logits,
        KEY_STATE_DTYPE: torch_dtype_name(layout.state_dtype),
        KEY_QUANTIZATION: quantization,
    }


def read_layout(metadata: dict[str, str]):
    """The DeployLayout recorded in metadata_props (files without the keys: the concat layout of
    earlier releases, all logits, fp32 states)."""
    from gdn_export.layout import DeployLayout

    kv = metadata.get(KEY_KV_CACHE, "concat")
    window = int(metadata.get(KEY_WINDOW, 0))
    cache_len = None
    if kv == "inplace" and not window:
        if KEY_CACHE_LEN in metadata:
            cache_len = int(metadata[KEY_CACHE_LEN])
        else:  # the key cache's static length in the recorded state shapes
            keys = [s.shape[2] for s in read_state_layouts(metadata) or [] if s.kind == "key"]
            cache_len = keys[0] if keys and isinstance(keys[0], int) else None
    return DeployLayout.make(kv_cache=kv, cache_len=cache_len, sinks=int(metadata.get(KEY_SINKS, 0)),
                             window=window, logits=metadata.get(KEY_LOGITS, "all"),
                             state_dtype=metadata.get(KEY_STATE_DTYPE, "float32"))


def read_state_layouts(metadata: dict[str, str]) -> list[StateLayout] | None:
    """The state layouts recorded in metadata_props, or None if the file has none."""
    raw = metadata.get(KEY_STATES)
    if raw is None:
        return None
    return [StateLayout.from_json(d) for d in json.loads(raw)]
