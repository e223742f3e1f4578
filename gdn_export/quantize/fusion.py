"""Sibling projections calibrated for one fused quantized GEMM each, as ModelOpt's own export does
(and `use_torch_fake_quant`: ModelOpt's fake quantization without its CUDA extensions).

Siblings are the Linears of one input that `fusible_linears()` lists (attention q / k / v, MLP
gate / up, the GDN input projections). The runtime (gdn_export.modules.quant_fusion) runs a run of
same-format siblings as ONE quantized GEMM only when that is exact, i.e. when the members share
their per-input quantities:

    fp8       one activation scale: input amax = the max over the siblings
    int4-awq  one AWQ pre_quant_scale: the mean over the siblings, each weight rescaled by
              old / new pre-scale and its int4 block scales recalibrated on the rescaled weight

Both are ModelOpt's `modelopt.torch.export.quant_utils.preprocess_linear_fusion`, the step its
unified Hugging Face export applies to fused layers; `share_sibling_quantities` calls it on the
ModelOpt-wrapped model after calibration and before the quantized tensors are read off it.
Members whose quantizers are disabled (the 16-bit in_proj_b / in_proj_a) are left out.
"""

from __future__ import annotations

import contextlib
import io
import warnings

from torch import nn


def _quantized(module: nn.Module) -> bool:
    wq = getattr(module, "weight_quantizer", None)
    return wq is not None and bool(getattr(wq, "is_enabled", False))


def sibling_groups(model: nn.Module) -> list[list[nn.Module]]:
    """The quantized members (>= 2) of every sibling group of model (ModelOpt-wrapped)."""
    groups = []
    for module in model.modules():
        lister = getattr(module, "fusible_linears", None)
        if lister is None:
            continue
        for members in lister():
            quantized = [m for m in members if _quantized(m)]
            if len(quantized) > 1:
                groups.append(quantized)
    return groups


def share_sibling_quantities(model: nn.Module) -> int:
    """Give each sibling group of the calibrated ModelOpt model one input scale (fp8) or one
    pre_quant_scale (int4-awq) in place; returns the number of groups."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        from modelopt.torch.export.quant_utils import preprocess_linear_fusion

        groups = sibling_groups(model)
        for members in groups:
            preprocess_linear_fusion(members)
    return len(groups)


def use_torch_fake_quant() -> None:
    """Make ModelOpt fake-quantize with its PyTorch implementation, never its CUDA extensions. On a
    CUDA device ModelOpt otherwise builds them with nvcc (torch.utils.cpp_extension.load) on first
    use: minutes on a fresh machine. The PyTorch form is also the arithmetic that calibrate.py's
    extraction repeats (int4: round(W * 7 / amax); fp8: the e4m3 cast), on the CPU and the GPU alike.
    An extension already loaded in this process is left in use."""
    from modelopt.torch.quantization import extensions

    for name in ("get_cuda_ext", "get_cuda_ext_fp8", "get_cuda_ext_mx"):
        loader = getattr(extensions, name, None)
        if loader is not None and not hasattr(loader, "extension"):
            loader.extension = None  # ModelOpt's own "could not be built" state: the PyTorch fallback
