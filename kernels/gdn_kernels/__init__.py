"""Triton kernels of the gdn ops; `gdn_kernels.backend` is the `triton` backend.

    wy.py               chunk-local cumsum, (I + A)^-1, w, u, causal q.k   (prefill, part 1)
    chunk.py            sequential state walk + output; chunk_gated_delta_rule  (part 2)
    fused_recurrent.py  decode / short T, optionally in place
    gates.py            the same from the raw gate projections (a, b, A_log, dt_bias)
    causal_conv1d.py    depthwise causal conv1d with state, SiLU fused
    moe.py              routed experts: fused routing + grouped GEMM over each expert's tokens
    attention_decode.py split-KV masked GQA attention of decode steps (gdn::attention on a GPU)
    attention_prefill.py flash attention of prefill calls, visiting only the cache tiles the mask lets
                        each query block read (gdn::attention on a GPU)

On a machine without a GPU, set TRITON_INTERPRET=1 before importing this package to run the
kernels on CPU tensors (slowly).
"""
