"""`DeployLayout`: how a model's states and outputs are shaped for deployment (an export choice).

    kv_cache     "inplace" (default): each attention layer's K and V live in a preallocated cache
                 [batch, Hkv, cache_len, head_dim] that is an input and an output of the same shape;
                 the new tokens are written at each row's slots (ONNX TensorScatter, TensorRT
                 KV_CACHE_UPDATE) and attention reads the whole cache under a mask (ONNX Attention).
                 "concat": the K/V grow by concatenation each step ([batch, Hkv, past, head_dim] ->
                 past + seq), for TensorRT releases without the KV cache update layer; rows must
                 share their lengths (no ragged batches, no streaming).
    cache_len    slots per attention layer (inplace): the longest prompt + generation a row can hold
    sinks, window
                 streaming (StreamingLLM): with window W > 0 the cache holds the first S = sinks
                 tokens and a ring of the last W tokens (cache_len = S + W), so memory stays constant
                 for unbounded streams; each query reads the sinks and the ring entries at most W
                 positions back (see gdn_export.modules.kv_cache for the exact rule).
    logits       "last" (default): logits [batch, 1, V] of each row's last real token;
                 "all": [batch, seq, V] of every position (validation)
    state_dtype  storage dtype of the recurrent (GDN) state: fp32 (default), bf16 or fp16; the
                 arithmetic inside a step stays fp32

Positions are absolute: row b's tokens sit at past_lengths[b] + t, which drives rope (keys are
cached after rope) and, in streaming mode, the ring slot. Positions keep growing in a stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gdn_export.errors import GdnExportError

KV_INPLACE, KV_CONCAT = "inplace", "concat"
KV_CACHE_CHOICES = (KV_INPLACE, KV_CONCAT)
LOGITS_LAST, LOGITS_ALL = "last", "all"
LOGITS_CHOICES = (LOGITS_LAST, LOGITS_ALL)
DEFAULT_CACHE_LEN = 4096
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class DeployLayout:
    """See the module docstring. Build with `DeployLayout.make(...)`, which checks the values."""

    kv_cache: str = KV_INPLACE
    cache_len: int = DEFAULT_CACHE_LEN
    sinks: int = 0
    window: int = 0
    logits: str = LOGITS_LAST
    state_dtype: torch.dtype = torch.float32

    @classmethod
    def make(cls, kv_cache: str = KV_INPLACE, cache_len: int | None = None, sinks: int = 0,
             window: int = 0, logits: str = LOGITS_LAST,
             state_dtype: torch.dtype | str = torch.float32) -> "DeployLayout":
        """A checked layout; GdnExportError names the first bad value."""
        if kv_cache not in KV_CACHE_CHOICES:
            raise GdnExportError(f"kv cache layout must be one of {KV_CACHE_CHOICES}, got {kv_cache!r}")
        if logits not in LOGITS_CHOICES:
            raise GdnExportError(f"logits must be one of {LOGITS_CHOICES}, got {logits!r}")
        if isinstance(state_dtype, str):
            if state_dtype not in STATE_DTYPES:
                raise GdnExportError(f"state dtype must be one of {tuple(STATE_DTYPES)}, got {state_dtype!r}")
            state_dtype = STATE_DTYPES[state_dtype]
        if state_dtype not in STATE_DTYPES.values():
            raise GdnExportError(f"state dtype must be float32, bfloat16 or float16, got {state_dtype}")
        for name, value in (("attention sinks", sinks), ("attention window", window)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise GdnExportError(f"{name} must be an integer >= 0, got {value!r}")
        if sinks and not window:
            raise GdnExportError(f"attention sinks ({sinks}) need an attention window (--attention-window)")
        if window:
            if kv_cache != KV_INPLACE:
                raise GdnExportError("streaming (--attention-window) needs the inplace kv cache layout")
            if cache_len is not None and cache_len != sinks + window:
                raise GdnExportError(f"with streaming the cache holds sinks + window = {sinks + window} "
                                     f"slots; --max-cache-len {cache_len} contradicts it")
            cache_len = sinks + window
        cache_len = DEFAULT_CACHE_LEN if cache_len is None else cache_len
        if isinstance(cache_len, bool) or not isinstance(cache_len, int) or cache_len < 1:
            raise GdnExportError(f"max cache length must be an integer >= 1, got {cache_len!r}")
        return cls(kv_cache, cache_len, sinks, window, logits, state_dtype)

    @property
    def inplace(self) -> bool:
        return self.kv_cache == KV_INPLACE

    @property
    def streaming(self) -> bool:
        return self.window > 0

    def describe(self) -> str:
        """One line for progress output."""
        if not self.inplace:
            kv = "concat kv cache"
        elif self.streaming:
            kv = f"streaming kv cache ({self.sinks} sinks + {self.window}-token window)"
        else:
            kv = f"inplace kv cache of {self.cache_len} slots"
        state = str(self.state_dtype).removeprefix("torch.")
        return f"{kv}, {self.logits} logits, {state} recurrent state"


DEFAULT_LAYOUT = DeployLayout()
