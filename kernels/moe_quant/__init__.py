"""Routed-expert kernels with FP8 / INT4 expert weights (triton/moe_quant.py, on the routing of
kernels/moe); the op's contract is gdn_export/ops/moe_quant/__init__.py."""
