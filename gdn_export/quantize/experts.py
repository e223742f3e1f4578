"""Quantizing the routed experts (gdn_export.modules.mlp.MoeExperts) for `gdn-export quantize`.

ModelOpt 0.47 does quantize transformers 5's stacked experts (its `_QuantFusedExperts` wraps any
module with 3-D gate_up_proj / down_proj), but only by intercepting the two F.linear calls per
expert of transformers' eager expert loop, with ONE input quantizer shared by all experts of a
layer. Our experts never run F.linear: the whole routed computation is the gdn::moe op (one node
in the exported graph), so ModelOpt's wrapper sees no call and calibrates nothing. The experts are
therefore calibrated here, during the same ModelOpt forward loop, with ModelOpt's arithmetic (max
calibration):

    recording(model)   every MoeExperts of the fp32 calibration model runs the fp32 reference MoE
                       and records, per expert, the amax of the tokens routed to it (gate_up input)
                       and of its SwiGLU output (down input), and how many tokens it got
    fp8                weight_scale = row amax / 448 (per output channel), weight = e4m3(W / scale);
                       input_scale = expert amax / 448 (static, per expert and projection).
                       An expert no calibration token reached takes the largest input scale of its
                       layer's experts (the range covers every routed token of that layer); the
                       quantize progress says how many.
    int4-awq           round-to-nearest INT4 in groups of 128 along K: scale = group amax / 7 (in
                       the model dtype), q = round(W / scale) clamped to [-8, 7]. No AWQ pre-scale:
                       an AWQ pre_quant_scale is a per-input-channel multiply of the activations,
                       one per expert, which neither the gdn.MoE node nor its TensorRT plugin can
                       apply (the plugin takes the 16-bit weights and the one hidden input); the
                       experts are weight-only RTN, the dense Linears keep ModelOpt's AWQ.

Checks before the model is loaded (`check_experts`): int4-awq needs an even
moe_intermediate_size and hidden_size (ModelOpt's W4A16 packing pairs output rows).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from gdn_export.errors import GdnExportError
from gdn_export.modules.mlp import MoeExperts
from gdn_export.modules.quant_experts import Fp8MoeExperts, Int4MoeExperts, swap_experts
from gdn_export.ops.moe.naive import route
from gdn_export.ops.quant_linear.naive import FP8_MAX, pack_int4

GROUP_SIZE = 128
INT4_MAX = 7.0
MIN_SCALE = 1e-12


@dataclass
class ExpertStats:
    """Per expert of one layer: amax of the gate_up input, of the down input, routed token count."""

    gate_up_amax: torch.Tensor
    down_amax: torch.Tensor
    tokens: torch.Tensor = field(default=None)


def check_experts(config, fmt: str) -> None:
    """GdnExportError, before any load, when the experts of `config` cannot take `fmt`."""
    if not config.num_experts or fmt != "int4-awq":
        return
    for name, size in (("moe_intermediate_size", config.moe_intermediate_size), ("hidden_size", config.hidden_size)):
        if size % 2:
            raise GdnExportError(f"--format int4-awq cannot quantize the routed experts: {name} {size} is odd "
                                 f"(ModelOpt's W4A16 packing stores two output rows a byte)")


def _experts(model: nn.Module) -> list[tuple[str, MoeExperts]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, MoeExperts)]


@contextlib.contextmanager
def recording(model: nn.Module):
    """Within the block, every MoeExperts of `model` runs the fp32 reference experts and records its
    per-expert activation ranges; yields {experts module name: ExpertStats}."""
    stats: dict[str, ExpertStats] = {}
    found = _experts(model)
    for name, m in found:
        E = m.num_experts
        s = ExpertStats(torch.zeros(E), torch.zeros(E), torch.zeros(E, dtype=torch.long))
        stats[name] = s

        def routed(x, logits, top_k, norm, m=m, s=s):
            h32 = x.float()
            ids, weights = route(logits, top_k, norm)
            out = torch.zeros_like(h32)
            I = m.down_proj.shape[-1]
            for e in torch.unique(ids).tolist():
                token, slot = torch.where(ids == e)
                xe = h32[token]
                h = F.linear(xe, m.gate_up_proj[e].float())
                act = F.silu(h[:, :I]) * h[:, I:]
                s.gate_up_amax[e] = torch.maximum(s.gate_up_amax[e], xe.abs().max().cpu())
                s.down_amax[e] = torch.maximum(s.down_amax[e], act.abs().max().cpu())
                s.tokens[e] += len(token)
                y = F.linear(act, m.down_proj[e].float())
                out.index_add_(0, token, y * weights[token, slot, None].float())
            return out.to(x.dtype)

        m.routed = routed
    try:
        yield stats
    finally:
        for _, m in found:
            m.__dict__.pop("routed", None)


def _input_scales(amax: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """fp32 [E] = amax / 448; experts without tokens take the layer's largest scale."""
    scale = amax.float().clamp(min=MIN_SCALE) / FP8_MAX
    hit = tokens > 0
    if hit.any() and not hit.all():
        scale = torch.where(hit, scale, scale[hit].max())
    return scale


def _fp8_weight(W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [E, N, K] -> (fp8 [E, N, K], fp32 scale [E, N, 1]) per output channel."""
    ws = W.abs().amax(-1, keepdim=True).clamp(min=MIN_SCALE) / FP8_MAX
    return (W / ws).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), ws.float()


def _int4_weight(W: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [E, N, K] -> (uint8 [E, N, ceil(K/2)] ONNX INT4 order, scale [E, N, ceil(K/128)] in dtype), RTN."""
    E, N, K = W.shape
    G = -(-K // GROUP_SIZE)
    padded = F.pad(W, (0, G * GROUP_SIZE - K)).reshape(E, N, G, GROUP_SIZE)
    # in the stored dtype, kept >= its smallest normal (an all-zero group in fp16 would round to 0)
    scale = (padded.abs().amax(-1).clamp(min=MIN_SCALE) / INT4_MAX).to(dtype).clamp(min=torch.finfo(dtype).tiny)
    full = scale.float().repeat_interleave(GROUP_SIZE, -1)[..., :K]
    q = torch.round(W / full).clamp(-8, 7).to(torch.int8)
    return pack_int4(q.reshape(E * N, K)).reshape(E, N, -1), scale


def quantize_experts(model: nn.Module, fmt: str, stats: dict[str, ExpertStats], dtype: torch.dtype,
                     progress=None) -> dict[str, dict[str, torch.Tensor]]:
    """{experts module name: {buffer name: tensor}} in the gdn_export.modules.quant_experts layouts,
    from the fp32 calibration `model`'s experts and the `recording` stats."""
    say = progress or (lambda _m: None)
    out: dict[str, dict[str, torch.Tensor]] = {}
    unhit = total = 0
    for name, m in _experts(model):
        gu, dn = m.gate_up_proj.detach().float(), m.down_proj.detach().float()
        if fmt == "fp8":
            s = stats[name]
            gu_q, gu_s = _fp8_weight(gu)
            dn_q, dn_s = _fp8_weight(dn)
            unhit += int((s.tokens == 0).sum())
            out[name] = {"gate_up_proj": gu_q, "gate_up_proj_weight_scale": gu_s,
                         "down_proj": dn_q, "down_proj_weight_scale": dn_s,
                         "gate_up_proj_input_scale": _input_scales(s.gate_up_amax, s.tokens),
                         "down_proj_input_scale": _input_scales(s.down_amax, s.tokens)}
        else:
            gu_q, gu_s = _int4_weight(gu, dtype)
            dn_q, dn_s = _int4_weight(dn, dtype)
            out[name] = {"gate_up_proj": gu_q, "gate_up_proj_weight_scale": gu_s,
                         "down_proj": dn_q, "down_proj_weight_scale": dn_s}
        total += m.num_experts
    if out:
        how = ("FP8 weights per channel, FP8 activation scale per expert" if fmt == "fp8"
               else "INT4 round-to-nearest, groups of 128")
        say(f"routed experts: {total} in {len(out)} layers quantized ({how})")
        if fmt == "fp8":
            say(f"routed experts: {unhit} of {total} got no calibration token; their activation scale is the "
                f"largest of their layer's experts" + (" (give more --calib-samples)" if unhit else ""))
    return out


def apply_experts(model: nn.Module, fmt: str, tensors: dict) -> nn.Module:
    """Swap the MoeExperts named in `tensors` for Fp8MoeExperts / Int4MoeExperts holding them."""
    dtype = model.dtype
    for name, t in tensors.items():
        old = model.get_submodule(name)
        E, I2, H = old.gate_up_proj.shape
        device = old.gate_up_proj.device
        if fmt == "fp8":
            new = Fp8MoeExperts(E, H, I2 // 2, "fp8", device=device)
        else:
            new = Int4MoeExperts(E, H, I2 // 2, GROUP_SIZE, dtype=dtype, device=device)
        for key, value in t.items():
            buf = getattr(new, key)
            buf.copy_(value.to(device=device, dtype=buf.dtype))
        swap_experts(model, name, new)
    return model


def checkpoint_tensors(model: nn.Module, family, config) -> dict[str, torch.Tensor]:
    """The quantized experts of `model` as ModelOpt's unified HF checkpoint stores them, per expert:

        {p}.experts.{e}.gate_proj|up_proj|down_proj.weight        FP8 [out, in] / W4A16 uint8 [out/2, in]
        ... .weight_scale    FP8: fp32 [out] (per channel); W4A16: [out, ceil(in/128)] in the model dtype
        ... .input_scale     FP8: fp32 [] (gate_proj and up_proj carry the same, shared input scale)

    {p} is the family's checkpoint name of the layer's mlp (model.language_model. for Qwen3.5 composites).
    """
    from gdn_export.modules.quant_experts import QuantMoeExperts
    from gdn_export.ops.quant_linear.naive import unpack_int4
    from gdn_export.weights.quant_format import pack_modelopt_int4

    out: dict[str, torch.Tensor] = {}
    for name, m in model.named_modules():
        if not isinstance(m, QuantMoeExperts):
            continue
        prefix = family.checkpoint_name(f"{name}.gate_up_proj", config)[: -len("gate_up_proj")]
        I, H = m.intermediate_size, m.hidden_size
        fp8 = isinstance(m, Fp8MoeExperts)
        for e in range(m.num_experts):
            for proj, w, s, rows, K, s_in in (
                    ("gate_proj", m.gate_up_proj, m.gate_up_proj_weight_scale, slice(0, I), H, "gate_up_proj"),
                    ("up_proj", m.gate_up_proj, m.gate_up_proj_weight_scale, slice(I, 2 * I), H, "gate_up_proj"),
                    ("down_proj", m.down_proj, m.down_proj_weight_scale, slice(0, H), I, "down_proj")):
                key = f"{prefix}{e}.{proj}."
                if fp8:
                    out[key + "weight"] = w[e, rows]
                    out[key + "weight_scale"] = s[e, rows, 0]
                    out[key + "input_scale"] = getattr(m, f"{s_in}_input_scale")[e].reshape(())
                else:
                    out[key + "weight"] = pack_modelopt_int4(unpack_int4(w[e, rows], K))
                    out[key + "weight_scale"] = s[e, rows]
    return {k: v.detach().cpu().clone() for k, v in out.items()}  # own storage each (safetensors)
