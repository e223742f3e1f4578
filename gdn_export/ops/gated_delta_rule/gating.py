"""The Gated DeltaNet layer's gates: the contract shared by the PyTorch form and the fused kernel.

    gdn_gating(a, b, A_log, dt_bias, token_mask, beta_scale=1.0) -> (g, beta)
        a, b        [B, T, Hv]  one float dtype (the layer's a / b projections)
        A_log, dt_bias [Hv]     any float dtype
        token_mask  [B, T]      bool: real tokens (False: a ragged row's padding)
        g           [B, T, Hv]  fp32: -exp(A_log) * softplus(a + dt_bias); 0 where padded
        beta        [B, T, Hv]  b's dtype: sigmoid(b) * beta_scale (2.0: OLMo-Hybrid's negative
                    eigenvalues); 0 where padded
    A padded token so takes an exact identity step of the delta rule (no decay, no write).

Where it runs: the fused kernel (kernels/gated_delta_rule/triton/gating.py) where
gdn_export.ops.backends.fused_eager says (eager mode on CUDA tensors, a backend other than
"reference", no gradient asked for; GDN_EXPORT_FUSED_KERNELS=0 turns it off); everywhere else the PyTorch form
(`gdn_gating_torch`), which the exported graph and torch.compile see. The two agree to fp32 rounding
in g (1e-5 relative: exp and log1p of two libraries) and to one rounding of b's dtype in beta.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gdn_export.ops import backends, glue
from gdn_export.ops.dtypes import as_dtype


def _kernel():
    return glue.kernel_module("kernels.gated_delta_rule.triton.gating")


def gdn_gating_torch(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                     token_mask: torch.Tensor, beta_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The PyTorch form of `gdn_gating` (the graph's nodes)."""
    beta = torch.sigmoid(b)
    if beta_scale != 1.0:
        beta = beta * beta_scale
    f32 = torch.float32
    # fp32 before exp: in fp16 a large A_log would overflow.
    g = -as_dtype(A_log, f32).exp() * F.softplus(as_dtype(a, f32) + as_dtype(dt_bias, f32))
    real = token_mask[..., None]
    return torch.where(real, g, 0.0), torch.where(real, beta, 0.0)


def fused_ready(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                token_mask: torch.Tensor) -> bool:
    """Whether `gdn_gating` takes the fused kernel: backends.fused_eager (A_log and dt_bias go in as
    parameters), a, b [B, T, Hv] of one kernel dtype, A_log and dt_bias [Hv] floats, token_mask
    [B, T] bool, all on one device."""
    if not backends.fused_eager(a, b, token_mask, params=(A_log, dt_bias)):
        return False
    kernel = _kernel()
    if kernel is None or a.dim() != 3 or a.dtype not in kernel.DTYPES or b.shape != a.shape or b.dtype != a.dtype:
        return False
    H = a.shape[-1]
    if A_log.shape != (H,) or dt_bias.shape != (H,) or not (A_log.is_floating_point() and dt_bias.is_floating_point()):
        return False
    if token_mask.dtype != torch.bool or token_mask.shape != a.shape[:2]:
        return False
    return all(t.device == a.device for t in (b, A_log, dt_bias, token_mask))


def gdn_gating_fused(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                     token_mask: torch.Tensor, beta_scale: float = 1.0,
                     out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused kernel alone (no dispatch; CUDA tensors, or CPU under TRITON_INTERPRET=1), written into
    `out` = (g, beta) (contiguous, the contract's shapes and dtypes) when given. ValueError naming
    what breaks the contract."""
    kernel = glue.require(_kernel(), "gdn_gating_fused")
    if a.dim() != 3 or a.dtype not in kernel.DTYPES or b.shape != a.shape or b.dtype != a.dtype:
        raise ValueError(f"gdn_gating_fused: a and b must be one [B, T, Hv] float tensor shape and dtype, got "
                         f"{tuple(a.shape)} {a.dtype} and {tuple(b.shape)} {b.dtype}")
    B, T, H = a.shape
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        if tuple(t.shape) != (H,) or not t.is_floating_point():
            raise ValueError(f"gdn_gating_fused: {name} must be a float [Hv={H}], got {tuple(t.shape)} {t.dtype}")
    if token_mask.dtype != torch.bool or tuple(token_mask.shape) != (B, T):
        raise ValueError(f"gdn_gating_fused: token_mask must be bool [B, T] = {(B, T)}, got "
                         f"{tuple(token_mask.shape)} {token_mask.dtype}")
    if out is None:
        out = (torch.empty(a.shape, dtype=torch.float32, device=a.device),
               torch.empty(a.shape, dtype=b.dtype, device=a.device))
    g, beta = out
    if (g.shape != a.shape or g.dtype != torch.float32 or not g.is_contiguous() or beta.shape != a.shape
            or beta.dtype != b.dtype or not beta.is_contiguous()):
        raise ValueError("gdn_gating_fused: out must be contiguous (g fp32, beta in b's dtype) of a's shape")
    # the bool mask as it is (a Triton *i1 pointer reads its bytes): Inductor (torch 2.11, `--compile`)
    # fails to lower a bool -> uint8 view
    real = token_mask.reshape(-1).contiguous()
    kernel.gdn_gating_rows(glue.rows(a), glue.rows(b), A_log.contiguous(), dt_bias.contiguous(), real, beta_scale,
                           g.view(-1, H), beta.view(-1, H))
    return g, beta


def gdn_gating(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
               token_mask: torch.Tensor, beta_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) (the contract above): the fused kernel where `fused_ready`, else the PyTorch form."""
    if fused_ready(a, b, A_log, dt_bias, token_mask):
        return gdn_gating_fused(a, b, A_log, dt_bias, token_mask, beta_scale)
    return gdn_gating_torch(a, b, A_log, dt_bias, token_mask, beta_scale)
