"""Triton kernels of the gated delta rule (entered through gdn_export/ops/gated_delta_rule/triton.py).

    wy.py               chunk-local cumsum, (I + A)^-1, w, u, causal q.k   (prefill, part 1;
                        the fused form: (I + A)^-1 only)
    chunk.py            sequential state walk + output; chunk_gated_delta_rule  (part 2; the fused
                        form also forms u - w h and q.k per chunk)
    fused_recurrent.py  decode / short T, optionally in place
    gates.py            the same from the raw gate projections (a, b, A_log, dt_bias)

Helpers shared with the other ops' kernels are in kernels/triton_utils.py.
"""
