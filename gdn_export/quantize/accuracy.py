"""How far a quantized model is from its 16-bit self: logits relative RMS and greedy agreement.

`dequantized_copy(model)` is the same model with every quantized Linear replaced by an nn.Linear
holding its dequantized weight (fp8: weight * scale; int4: int4 * scale with the AWQ pre-scale
folded into the columns): the 16-bit model the quantized one approximates. For a checkpoint
quantized by `gdn-export quantize` or published in FP8, it is the model the weights came from up to
the weight rounding; `bench --quant` compares against the original 16-bit checkpoint instead.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from gdn_export.modules.mlp import MoeExperts
from gdn_export.modules.quant_experts import QuantMoeExperts, dequantized_experts
from gdn_export.modules.kv_cache_fp8 import set_kv_scales
from gdn_export.modules.quant_linear import Fp8BlockLinear, Fp8Linear, Int4Linear, QuantLinear, swap_linear
from gdn_export.ops.quant_linear.naive import dequantize_block, dequantize_int4


def dequantized_weight(m: QuantLinear) -> torch.Tensor:
    """fp32 [N, K]: the weight a quantized layer multiplies by (pre-scale folded in for int4)."""
    if isinstance(m, Fp8Linear):
        return m.weight.float() * m.weight_scale.float()[:, None]
    if isinstance(m, Fp8BlockLinear):
        return dequantize_block(m.weight, m.weight_scale_inv)
    if isinstance(m, Int4Linear):
        W = dequantize_int4(m.weight, m.weight_scale, m.in_features, m.group_size)
        return W * m.pre_quant_scale.float()[None, :] if m.pre_quant_scale is not None else W
    raise TypeError(type(m))


def dequantized_copy(model: nn.Module) -> nn.Module:
    """A deep copy of model with every QuantLinear as an nn.Linear of its dequantized weight."""
    out = copy.deepcopy(model)
    set_kv_scales(out, None)  # an FP8 K/V cache back in the model dtype: the distance includes its rounding
    dtype = out.dtype
    for name, m in list(out.named_modules()):
        if isinstance(m, QuantLinear) and not name.rpartition(".")[2].startswith("_fused"):
            lin = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device=m.weight.device,
                            dtype=dtype)
            with torch.no_grad():
                lin.weight.copy_(dequantized_weight(m))
                if m.bias is not None:
                    lin.bias.copy_(m.bias)
            lin.requires_grad_(False)
            swap_linear(out, name, lin)
        elif isinstance(m, QuantMoeExperts):  # routed experts: 16-bit MoeExperts of the dequantized weights
            experts = MoeExperts(m.num_experts, m.hidden_size, m.intermediate_size).to(device=m.gate_up_proj.device,
                                                                                      dtype=dtype)
            gate_up, down = dequantized_experts(m)
            with torch.no_grad():
                experts.gate_up_proj.copy_(gate_up)
                experts.down_proj.copy_(down)
            experts.requires_grad_(False)
            swap_linear(out, name, experts)
    return out


def last_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """fp32 logits [B, V] of the last token of each row of ids [B, T] (one prefill)."""
    B, T = ids.shape
    with torch.no_grad():
        out = model(ids, torch.zeros(B, dtype=torch.long, device=ids.device),
                    torch.full((B,), T, device=ids.device), *model.empty_states(B, ids.device))
    return out[0][:, -1].float()


def _decode(model, prompt: torch.Tensor, steps: int, forced: torch.Tensor | None = None) -> torch.Tensor:
    """[B, steps] argmax tokens: prefill prompt [B, T], then one token a step, fed its own argmax
    (greedy) or forced[:, i] (teacher forcing)."""
    B, T = prompt.shape
    dev = prompt.device
    picks = []
    with torch.no_grad():
        out = model(prompt, torch.zeros(B, dtype=torch.long, device=dev), torch.full((B,), T, device=dev),
                    *model.empty_states(B, dev))
        logits, states, past = out[0][:, -1], list(out[1:]), T
        for i in range(steps):
            pick = logits.argmax(-1)
            picks.append(pick)
            nxt = pick if forced is None else forced[:, i]
            out = model(nxt[:, None], torch.full((B,), past, device=dev), torch.ones(B, dtype=torch.long, device=dev),
                        *states)
            logits, states, past = out[0][:, -1], list(out[1:]), past + 1
    return torch.stack(picks, 1)


def compare(quantized, reference, prompt: torch.Tensor, steps: int = 64) -> dict:
    """{"logits_rel_rms", "greedy_agreement", "greedy_steps"}: relative RMS of the difference of the
    prompt's last-token logits, and the fraction of `steps` greedy steps on which the quantized model,
    fed the reference's greedy tokens (teacher forcing, so one early miss does not count for all
    later steps), picks the reference's token."""
    a, b = last_logits(quantized, prompt), last_logits(reference, prompt)
    rel = float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp(min=1e-30))
    ref_tokens = _decode(reference, prompt, steps)
    picks = _decode(quantized, prompt, steps, forced=ref_tokens)
    return {"logits_rel_rms": rel, "greedy_agreement": float((picks == ref_tokens).float().mean()),
            "greedy_steps": steps}


# ------------------------------------------------------------------ through a Runner (bench --quant)
def runner_greedy(runner, prompts: np.ndarray, steps: int) -> dict:
    """The reference side of `runner_compare`: {"last_logits": fp32 [B, V] at the prompts' last
    token, "tokens": int64 [B, steps] greedy picks}, through the Runner interface (prompts [B, T]
    int64; the runner's layout must hold T + steps tokens). One row of logits a step is kept."""
    from gdn_export.runtime.base import prefill

    B, T = prompts.shape
    logits, states = prefill(runner, list(prompts), runner.empty_states(B))
    last = logits[:, -1]
    first, picks = last.astype(np.float32), []
    for i in range(steps):
        pick = last.argmax(-1).astype(np.int64)[:, None]
        picks.append(pick)
        if i + 1 < steps:
            logits, states = runner.forward(pick, T + i, states)
            last = logits[:, -1]
    return {"last_logits": first, "tokens": np.concatenate(picks, axis=1)}


def runner_compare(runner, prompts: np.ndarray, reference: dict) -> dict:
    """compare()'s metrics for a Runner against `runner_greedy`'s output of the reference model:
    {"logits_rel_rms", "greedy_agreement", "greedy_steps"}; the runner is fed the reference's
    greedy tokens (teacher forcing) and its argmax compared at each step."""
    from gdn_export.runtime.base import prefill

    ref_tokens = reference["tokens"]
    B, T = prompts.shape
    steps = ref_tokens.shape[1]
    logits, states = prefill(runner, list(prompts), runner.empty_states(B))
    a, b = logits[:, -1].astype(np.float64), reference["last_logits"].astype(np.float64)
    rel = float(np.sqrt(np.mean((a - b) ** 2)) / max(np.sqrt(np.mean(b ** 2)), 1e-30))
    agree = 0
    last = logits[:, -1]
    for i in range(steps):
        agree += int((last.argmax(-1) == ref_tokens[:, i]).sum())
        if i + 1 < steps:
            logits, states = runner.forward(ref_tokens[:, i:i + 1], T + i, states)
            last = logits[:, -1]
    return {"logits_rel_rms": rel, "greedy_agreement": agree / (B * steps), "greedy_steps": steps}
