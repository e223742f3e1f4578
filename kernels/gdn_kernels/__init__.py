"""Triton kernels of the gdn ops; `gdn_kernels.backend` is the `triton` backend.

    wy.py               chunk-local cumsum, (I + A)^-1, w, u, causal q.k   (prefill, part 1)
    chunk.py            sequential state walk + output; chunk_gated_delta_rule  (part 2)
    chunk_state.py      impl="split", part 2: the walk stores each chunk's state and v_new
    chunk_output.py     impl="split", part 3: o for all chunks in parallel
    fused_recurrent.py  decode / short T, optionally in place
    gates.py            the same from the raw gate projections (a, b, A_log, dt_bias)
    causal_conv1d.py    depthwise causal conv1d with state, SiLU fused

Prefill has two implementations with the same contract, chosen per call by
`chunk_gated_delta_rule(..., impl="fused" | "split")` (also `gated_delta_rule_from_gates`), or for
every call that passes no impl (the `triton` backend included) by the environment variable
GDN_TRITON_PREFILL=fused|split, read at each call. "fused" (the default) computes o inside the
sequential walk; "split" moves o out of it into a parallel kernel, at the price of storing each
chunk's state (see benchmarks/README.md for what each costs).

On a machine without a GPU, set TRITON_INTERPRET=1 before importing this package to run the
kernels on CPU tensors (slowly).
"""
