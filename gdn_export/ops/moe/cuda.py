"""The routed experts through our CUDA kernels (kernels/moe/cuda/moeKernels.cu, bound by
gdn_export/cuda/extension.cpp and built by gdn_export.cuda.extension): the `cuda` backend's entry
for this op (gdn_export.ops.cuda_backend).

    moe(hidden [N, H], router_logits [N, E], gate_up [E, 2I, H], down [E, H, I], top_k,
        norm_topk_prob) -> out [N, H]

E <= MAX_EXPERTS, top_k <= MAX_TOP_K. Tensors must be on a CUDA device.
"""

from __future__ import annotations

from gdn_export.cuda import extension
from gdn_export.cuda.extension import compute_dtype, require_cuda
from gdn_export.errors import GdnExportError
from gdn_export.ops.moe import check_inputs as _check_moe_inputs

MAX_EXPERTS, MAX_TOP_K = 1024, 32  # kMAX_EXPERTS / kMAX_TOP_K in moeKernels.h


def moe(hidden, router_logits, gate_up, down, top_k, norm_topk_prob):
    """Returns out [N, H] in hidden's dtype. All four tensors run in hidden's dtype (fp64 in fp32):
    weights in another dtype are cast, which reads every expert: keep them in hidden's dtype."""
    try:
        _check_moe_inputs(hidden, router_logits, gate_up, down, top_k)
    except ValueError as exc:
        raise GdnExportError(f"cuda backend: {exc}") from exc
    E = router_logits.shape[1]
    if E > MAX_EXPERTS or top_k > MAX_TOP_K:
        raise GdnExportError(f"cuda backend: moe supports E <= {MAX_EXPERTS} and top_k <= {MAX_TOP_K}, "
                             f"got E={E}, top_k={top_k}")
    require_cuda(hidden=hidden, router_logits=router_logits, gate_up=gate_up, down=down)
    dt = compute_dtype(hidden.dtype, "hidden")
    args = [t if t.dtype == dt and t.is_contiguous() else t.to(dt).contiguous()
            for t in (hidden, router_logits, gate_up, down)]
    return extension.load().moe(*args, int(top_k), bool(norm_topk_prob)).to(hidden.dtype)
