"""Calibration with NVIDIA ModelOpt, and the quantized tensors it gives each Linear.

ModelOpt's torch quantization (`modelopt.torch.quantization.quantize(model, cfg, forward_loop)`)
runs on our PyTorch model on the CPU: it wraps every nn.Linear in a fake-quantizing QuantLinear,
runs the forward loop (the gdn custom ops run through their reference backend) and calibrates:

    fp8       FP8_DEFAULT_CFG with the weight quantizer per output channel (axis 0): max
              calibration of each Linear's input (input_scale = amax / 448, static, per tensor) and
              of each weight row (weight_scale = row amax / 448)
    int4-awq  INT4_AWQ_CFG: AWQ-lite's activation-aware per-input-channel scale search
              (pre_quant_scale [K]; the weight is rescaled by ModelOpt to match), then max
              calibration of int4 blocks of 128 along K (weight_scale = block amax / 7)

ModelOpt's default exclusions already leave lm_head, the routers (mlp.gate), shared_expert_gate,
in_proj_a / in_proj_b and the convs in 16 bits; we add Qwen3-Next's fused in_proj_ba and
OLMo-Hybrid's a_proj / b_proj. `lm_head=True` (fp8 only; `quantize --quantize-lm-head`) quantizes
the vocabulary projection as the other Linears (FP8 per output channel, static input scale); a tied
embedding keeps its 16-bit table for the lookup. Routed experts are stacked parameters run by the gdn::moe op, whose
calls ModelOpt's fused-experts wrapper never sees: gdn_export.quantize.experts calibrates them
during the same forward loop (the pipeline wraps this call in its `recording`).

Sibling projections of one input (q/k/v, gate/up, GDN q|k|v/z) get one shared FP8 input scale (the
max of their amax) or one AWQ pre_quant_scale (their mean, weights rescaled), as ModelOpt's export
does for fused layers (gdn_export.quantize.fusion), so that the runtime runs each group as one
quantized GEMM (gdn_export.modules.quant_fusion).
"""

from __future__ import annotations

import copy
import io
import contextlib
import warnings

import numpy as np
import torch
from torch import nn

from gdn_export.errors import GdnExportError
from gdn_export.modules.quant_linear import Fp8Linear, Int4Linear, swap_linear
from gdn_export.quantize.fusion import share_sibling_quantities, use_torch_fake_quant
from gdn_export.ops.quant_linear.naive import FP8_MAX, pack_int4

GROUP_SIZE = 128
INT4_MAX = 7.0
# Linears ModelOpt's presets do not already exclude that these models keep in 16 bits.
EXTRA_EXCLUDED = ("*in_proj_ba*", "*linear_attn.a_proj*", "*linear_attn.b_proj*", "*shared_expert_gate*")
MIN_SCALE = 1e-12


def _modelopt():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import modelopt
            import modelopt.torch.quantization as mtq
    except ImportError as exc:
        raise GdnExportError(f"quantize needs NVIDIA ModelOpt: pip install nvidia-modelopt==0.47.0 ({exc})") from None
    return mtq, modelopt.__version__


def modelopt_version() -> str:
    return _modelopt()[1]


def _config(mtq, fmt: str, lm_head: bool = False) -> dict:
    base = copy.deepcopy(mtq.FP8_DEFAULT_CFG if fmt == "fp8" else mtq.INT4_AWQ_CFG)
    cfg = base["quant_cfg"]
    if fmt == "fp8":
        for entry in cfg:
            if entry.get("quantizer_name") == "*weight_quantizer":
                entry["cfg"] = {**entry["cfg"], "axis": 0}  # per output channel
    cfg.extend({"quantizer_name": name, "enable": False} for name in EXTRA_EXCLUDED)
    if lm_head:  # later entries win: the lm_head's quantizers as every other Linear's
        cfg.extend({**entry, "quantizer_name": "*lm_head*" + entry["quantizer_name"][1:]} for entry in list(cfg)
                   if entry.get("quantizer_name") in ("*weight_quantizer", "*input_quantizer"))
    return base


def _forward_loop(rows: list[np.ndarray], batch: int, progress):
    def loop(model):
        device = next(model.parameters()).device
        groups: dict[int, list[np.ndarray]] = {}
        for r in rows:
            groups.setdefault(len(r), []).append(r)
        done = 0
        with torch.no_grad():
            for length, same in groups.items():
                for i in range(0, len(same), batch):
                    ids = torch.as_tensor(np.stack(same[i:i + batch]), device=device)
                    B = ids.shape[0]
                    model(ids, torch.zeros(B, dtype=torch.long, device=device),
                          torch.full((B,), length, device=device), *model.empty_states(B))
                    done += B
                    progress(f"calibration forward: {done}/{len(rows)} rows")
    return loop


def _enabled(q) -> bool:
    return q is not None and getattr(q, "is_enabled", False)


def calibrate(model: nn.Module, fmt: str, rows: list[np.ndarray], progress=None, batch: int = 8,
              lm_head: bool = False) -> dict:
    """Calibrate `model` (an fp32 HybridForCausalLM; ModelOpt modifies it in place) and return
    {Linear name: {buffer name: tensor}} in the gdn_export.modules.quant_linear layouts (fp32 /
    fp8 / uint8; Int4 scales fp32, cast to the model dtype by `apply`)."""
    say = progress or (lambda _m: None)
    mtq, version = _modelopt()
    say(f"calibrating with ModelOpt {version} ({'FP8_DEFAULT_CFG, weights per channel' if fmt == 'fp8' else 'INT4_AWQ_CFG'})")
    chatter = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(chatter):
        warnings.simplefilter("ignore")
        use_torch_fake_quant()  # no nvcc build of ModelOpt's CUDA extensions on a GPU
        mtq.quantize(model, _config(mtq, fmt, lm_head), _forward_loop(rows, batch, say))
    share_sibling_quantities(model)  # one input scale / pre_quant_scale per sibling group
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, m in model.named_modules():
        wq = getattr(m, "weight_quantizer", None)
        if not isinstance(getattr(m, "weight", None), torch.Tensor) or not _enabled(wq) or m.weight.dim() != 2:
            continue
        W = m.weight.detach().float()
        N, K = W.shape
        if fmt == "fp8":
            amax_in = m.input_quantizer.amax
            if amax_in is None:
                raise GdnExportError(f"calibration left {name} without an input range (was it run?)")
            ws = W.abs().amax(1).clamp(min=MIN_SCALE) / FP8_MAX
            out[name] = {"weight": (W / ws[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn),
                         "weight_scale": ws.float(),
                         "input_scale": (amax_in.detach().float().reshape(()).clamp(min=MIN_SCALE) / FP8_MAX)}
        else:
            if N % 2:
                continue  # ModelOpt's W4A16 packing pairs output rows: an odd-row Linear stays 16-bit
            G = -(-K // GROUP_SIZE)
            amax = wq.amax.detach().float().reshape(N, G)
            scale = amax.clamp(min=MIN_SCALE) / INT4_MAX
            # W * (7 / amax), rounded: ModelOpt's own arithmetic (its fake quantization), so that a
            # value on a rounding tie lands where ModelOpt's does
            inv = (INT4_MAX / amax.clamp(min=MIN_SCALE)).repeat_interleave(GROUP_SIZE, 1)[:, :K]
            q = torch.round(W * inv).clamp(-8, 7).to(torch.int8)
            pre = getattr(m.input_quantizer, "pre_quant_scale", None)
            out[name] = {"weight": pack_int4(q), "weight_scale": scale,
                         "pre_quant_scale": (pre.detach().float().reshape(K) if pre is not None
                                             else torch.ones(K))}
    return out


def apply(model: nn.Module, fmt: str, tensors: dict) -> nn.Module:
    """Swap model's Linears named in `tensors` for Fp8Linear / Int4Linear holding them (in place);
    returns model. Int4 scales and pre_quant_scale take the model's dtype."""
    dtype = model.dtype
    for name, t in tensors.items():
        old = model.get_submodule(name)
        N, K = old.out_features, old.in_features
        device = old.weight.device
        if fmt == "fp8":
            new = Fp8Linear(K, N, device=device)
        else:
            new = Int4Linear(K, N, GROUP_SIZE, dtype=dtype, device=device)
        for key, value in t.items():
            buf = getattr(new, key)
            buf.copy_(value.to(device=device, dtype=buf.dtype))
        if old.bias is not None:
            new.register_buffer("bias", old.bias.detach().clone())
        swap_linear(model, name, new)
    return model
