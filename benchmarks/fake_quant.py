"""An independent fake quantization of transformers' Qwen3.5 model, in plain PyTorch: the yardstick
that tells a loss of a quantization format from a loss of gdn-export's pipeline (quant_accuracy.py).

It shares no code with gdn_export.quantize or ModelOpt; the formats follow their published
definitions:

    fp8        weights per output channel: s_n = max_k |W[n, k]| / 448, W^ = e4m3(W / s_n) * s_n;
               activations static per tensor: s_x = (max |x| over the calibration tokens) / 448,
               x^ = e4m3(clamp(x / s_x, +-448)) * s_x (each quantized Linear's input)
    int4-awq   W4A16, groups of 128 along K: s_g = max |W[n, g]| / 7, q = clamp(round(W / s_g), -8, 7);
               AWQ's activation-aware scale search (Lin et al. 2023, without the clipping search):
               per Linear, s = mean|x|^a (normalised by sqrt(max * min)) for a in {0, 1/20, .., 19/20},
               the a whose W^ = RTN(W * s) / s gives the least squared error of X W^T on the
               calibration tokens X (a = 0 is plain round-to-nearest, so AWQ never loses to it there)
    int4-rtn   the same groups, round-to-nearest without the search (for reference)
    fp8 K/V    per attention layer, what the cache stores (K after k_norm and RoPE, V after v_proj)
               through e4m3 with static per-tensor scales amax / 448, in an attention function
               registered with transformers' AttentionInterface (SDPA after the rounding)

Quantized: every nn.Linear of the decoder layers (q / k / v / o, gate / up / down, in_proj_qkv,
in_proj_z, out_proj) except in_proj_a / in_proj_b (the GDN gates); the lm_head only when asked
(its activation static per tensor as above; tied embeddings keep the 16-bit lookup). The
arithmetic: the quantized Linear computes x^ @ W^T in fp32 and returns x's dtype.
"""

from __future__ import annotations

import contextlib
import copy
import math

import torch
from torch import nn

FP8_MAX = 448.0
INT4_MAX = 7.0
GROUP = 128
AWQ_GRID = 20
KEEP_16BIT = ("in_proj_a", "in_proj_b")
KV_ATTENTION = "gdn_fake_fp8_kv"
MIN_SCALE = 1e-12


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """fp32 x rounded to the nearest float8_e4m3fn (saturating at +-448), back in fp32."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()


def fp8_weight(W: torch.Tensor) -> torch.Tensor:
    """fp32 W^ [N, K] of W [N, K] quantized to e4m3 per output channel."""
    W = W.float()
    s = W.abs().amax(1, keepdim=True).clamp(min=MIN_SCALE) / FP8_MAX
    return e4m3(W / s) * s


def fp8_activation(x: torch.Tensor, scale: float) -> torch.Tensor:
    """fp32 x^ of x through e4m3 with the static scale."""
    return e4m3(x.float() / scale) * scale


def int4_rtn(W: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """fp32 W^ [N, K] of W [N, K] rounded to int4 in groups of `group` along K (K padded with 0)."""
    N, K = W.shape
    G = -(-K // group)
    Wg = nn.functional.pad(W.float(), (0, G * group - K)).reshape(N, G, group)
    s = Wg.abs().amax(-1, keepdim=True).clamp(min=MIN_SCALE) / INT4_MAX
    return ((Wg / s).round().clamp(-8, 7) * s).reshape(N, G * group)[:, :K]


def awq_weight(W: torch.Tensor, X: torch.Tensor, x_absmean: torch.Tensor, grid: int = AWQ_GRID):
    """(W^ fp32 [N, K], exponent a): AWQ's scale search for W [N, K] on calibration inputs X [M, K]
    with per-channel mean |x| x_absmean [K] (see the module docstring)."""
    W, X = W.float(), X.float()
    ref = X @ W.T
    mean = x_absmean.float().clamp(min=1e-4)
    best = (math.inf, None, 0.0)
    for i in range(grid):
        a = i / grid
        s = mean.pow(a)
        s = s / (s.max() * s.min()).sqrt()
        Wq = int4_rtn(W * s[None]) / s[None]
        err = float((X @ Wq.T - ref).pow(2).mean())
        if err < best[0]:
            best = (err, Wq, a)
    return best[1], best[2]


class FakeQuantLinear(nn.Module):
    """y = x^ @ W^T (fp32) in x's dtype: W^ fp32 [N, K]; act_scale None (16-bit activations) or the
    static FP8 scale of the input."""

    def __init__(self, weight_hat: torch.Tensor, act_scale: float | None, bias: torch.Tensor | None = None):
        super().__init__()
        self.register_buffer("weight_hat", weight_hat.float())
        self.register_buffer("bias", None if bias is None else bias.detach().float())
        self.act_scale = act_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float() if self.act_scale is None else fp8_activation(x, self.act_scale)
        y = xf @ self.weight_hat.T
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)


def target_linears(model: nn.Module, lm_head: bool = False) -> dict[str, nn.Linear]:
    """{name: Linear} the scheme quantizes in a Qwen3_5ForCausalLM (module docstring)."""
    out = {name: m for name, m in model.model.layers.named_modules(prefix="model.layers")
           if isinstance(m, nn.Linear) and name.rpartition(".")[2] not in KEEP_16BIT}
    if lm_head:
        out["lm_head"] = model.lm_head
    return out


# ------------------------------------------------------------------ calibration
class Stats:
    """What one calibration pass records: per Linear the input amax, mean |x| per channel and up to
    `keep` input rows (evenly strided over each batch); per attention layer the K and V amax."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.amax: dict[str, float] = {}
        self.abssum: dict[str, torch.Tensor] = {}
        self.count: dict[str, int] = {}
        self.rows: dict[str, list[torch.Tensor]] = {}
        self.kv_amax: dict[int, list[float]] = {}
        self.batches = 1

    def linear(self, name: str, x: torch.Tensor) -> None:
        x = x.detach().float().reshape(-1, x.shape[-1])
        self.amax[name] = max(self.amax.get(name, 0.0), float(x.abs().max()))
        self.abssum[name] = self.abssum.get(name, 0) + x.abs().sum(0)
        self.count[name] = self.count.get(name, 0) + x.shape[0]
        per_batch = max(self.keep // self.batches, 1)
        stride = max(x.shape[0] // per_batch, 1)
        self.rows.setdefault(name, []).append(x[::stride][:per_batch].clone())

    def inputs(self, name: str) -> torch.Tensor:
        return torch.cat(self.rows[name])[: self.keep]

    def absmean(self, name: str) -> torch.Tensor:
        return self.abssum[name] / self.count[name]


def _kv_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers attention function: records K / V amax or rounds K / V through e4m3 per the
    module's `fake_kv` ({"record": Stats} or {"scales": (k_scale, v_scale)}), then SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    spec = getattr(module, "fake_kv", None)
    if spec is not None and "record" in spec:
        amax = spec["record"].kv_amax.setdefault(module.layer_idx, [0.0, 0.0])
        amax[0] = max(amax[0], float(key.detach().abs().max()))
        amax[1] = max(amax[1], float(value.detach().abs().max()))
    elif spec is not None:
        ks, vs = spec["scales"]
        key = fp8_activation(key, ks).to(key.dtype)
        value = fp8_activation(value, vs).to(value.dtype)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _register_kv_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(KV_ATTENTION, _kv_attention)
    AttentionMaskInterface.register(KV_ATTENTION, sdpa_mask)


def attention_modules(model: nn.Module) -> dict[int, nn.Module]:
    """{layer index: self_attn module} of the full-attention layers."""
    return {m.layer_idx: m for name, m in model.named_modules() if name.endswith("self_attn")}


def set_fake_kv(model: nn.Module, spec_of_layer) -> None:
    """Route the attention layers through the K/V function with spec_of_layer(i) as their `fake_kv`."""
    _register_kv_attention()
    for i, m in attention_modules(model).items():
        m.fake_kv = spec_of_layer(i)
    model.set_attn_implementation(KV_ATTENTION)


@contextlib.contextmanager
def recording(model: nn.Module, keep: int, batches: int, lm_head: bool = True):
    """Within the block, forwards of model record Stats (yielded): every target Linear's input (the
    lm_head's too when lm_head) and each attention layer's K / V amax. `batches`: how many forward
    calls will run (each keeps keep / batches rows per Linear)."""
    stats = Stats(keep)
    stats.batches = batches
    handles = [m.register_forward_pre_hook(lambda _m, args, name=name: stats.linear(name, args[0]))
               for name, m in target_linears(model, lm_head).items()]
    before = model.config._attn_implementation
    set_fake_kv(model, lambda _i: {"record": stats})
    try:
        yield stats
    finally:
        for h in handles:
            h.remove()
        for m in attention_modules(model).values():
            m.fake_kv = None
        model.set_attn_implementation(before)


@torch.no_grad()
def calibrate(model: nn.Module, rows: torch.Tensor, batch: int, keep: int) -> Stats:
    """Stats of model (best in fp32) over calibration rows [n, T] (int64), `batch` rows a forward."""
    chunks = list(torch.split(rows, batch))
    with recording(model, keep, len(chunks)) as stats:
        for ids in chunks:
            model(input_ids=ids.to(model.device))
    return stats


# ------------------------------------------------------------------ quantized copies
def quantized_copy(model: nn.Module, scheme: str, stats: Stats, lm_head: bool = False) -> nn.Module:
    """A deep copy of model (transformers, any dtype) whose target Linears are FakeQuantLinear of
    `scheme` ("fp8", "int4-awq", "int4-rtn"); lm_head also for fp8 when asked."""
    if scheme not in ("fp8", "int4-awq", "int4-rtn"):
        raise ValueError(f"scheme must be fp8, int4-awq or int4-rtn, got {scheme!r}")
    out = copy.deepcopy(model)
    for name, lin in target_linears(out, lm_head and scheme == "fp8").items():
        W = lin.weight.detach().float()
        if scheme == "fp8":
            new = FakeQuantLinear(fp8_weight(W), max(stats.amax[name], MIN_SCALE) / FP8_MAX, lin.bias)
        elif scheme == "int4-rtn":
            new = FakeQuantLinear(int4_rtn(W), None, lin.bias)
        else:
            Wq, _ = awq_weight(W, stats.inputs(name).to(W.device), stats.absmean(name).to(W.device))
            new = FakeQuantLinear(Wq, None, lin.bias)
        parent, _, child = name.rpartition(".")
        setattr(out.get_submodule(parent) if parent else out, child, new.to(W.device))
    return out


def kv_scales(stats: Stats) -> dict[int, tuple[float, float]]:
    """{attention layer: (k_scale, v_scale)} = amax / 448 from a calibration pass."""
    return {i: (max(k, 1e-6) / FP8_MAX, max(v, 1e-6) / FP8_MAX) for i, (k, v) in stats.kv_amax.items()}


def use_fp8_kv(model: nn.Module, scales: dict[int, tuple[float, float]]) -> nn.Module:
    """model (in place) with its K/V rounded through e4m3 at the per-layer scales; returns model."""
    missing = set(attention_modules(model)) - set(scales)
    if missing:
        raise ValueError(f"no K/V scales for attention layers {sorted(missing)}")
    set_fake_kv(model, lambda i: {"scales": scales[i]})
    return model
