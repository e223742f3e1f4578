"""Triton kernels of the gated delta rule (the `triton` backend: gdn_export.ops.triton_backend).

    wy.py               chunk-local cumsum, (I + A)^-1, w, u, causal q.k   (prefill, part 1)
    chunk.py            sequential state walk + output; chunk_gated_delta_rule  (part 2)
    fused_recurrent.py  decode / short T, optionally in place
    gates.py            the same from the raw gate projections (a, b, A_log, dt_bias)

The other ops keep their Triton kernels beside them: causal_conv1d/triton.py, moe/triton.py,
attention/triton/ (decode, prefill, kv_cache_write); helpers shared by all of them are in
gdn_export/ops/triton_utils.py. On a machine without a GPU, set TRITON_INTERPRET=1 before importing
them to run the kernels on CPU tensors (slowly).
"""
