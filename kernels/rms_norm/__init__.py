"""RMSNorm kernels: Triton (triton/rms_norm.py); the op's contract is gdn_export/ops/rms_norm/__init__.py."""
