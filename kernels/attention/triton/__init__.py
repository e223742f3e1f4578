"""The attention Triton kernels: decode.py (split-KV decode), prefill.py (flash-attention prefill over
the written cache slots), kv_cache_write.py (the in-place K/V write)."""
