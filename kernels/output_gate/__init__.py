"""The gated attention's output gate kernels: Triton (triton/output_gate.py); the op's contract is
gdn_export/ops/output_gate/__init__.py."""
