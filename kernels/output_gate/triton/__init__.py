"""The fused output gate Triton kernel (output_gate.py)."""
