"""Attention kernels (triton/: decode, prefill, K/V cache write, over a 16-bit or FP8 cache); the op's
contract is gdn_export/ops/attention/__init__.py."""
