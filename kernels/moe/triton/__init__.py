"""The routed-expert Triton kernels (moe.py): routing, row-block schedule, SwiGLU experts."""
