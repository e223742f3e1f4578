"""Gated full attention of Qwen3-Next / Qwen3.5 over a K/V cache.

Per layer (H query heads, Hkv key/value heads, head size D, R rotary channels):

    q, gate = q_proj(x) split per head as [q_h | gate_h]      (q_proj: H*2D outputs)
    q = rope(q_norm(q)), k = rope(k_norm(k_proj(x))), v = v_proj(x)
    cache:  in place: K, V = the cache [B, Hkv, L, D] with k, v written at each row's slots
            (gdn::kv_cache_update -> ONNX TensorScatter), mask from gdn_export.modules.kv_cache
            concat:   K, V = concat(past, new) along time, causal mask offset by the past length P
    o = softmax(q K^T / sqrt(D), masked) V                     (GQA: head h reads kv head h // (H/Hkv))
    out = o_proj(o * sigmoid(gate))

In place, attention is gdn::attention (-> ONNX Attention, TensorRT's fused attention); the concat
layout keeps the plain MatMul / Softmax chain that older TensorRT releases parse.
"""

from __future__ import annotations

import torch
from torch import nn

from gdn_export.config import HybridConfig
from gdn_export.ops.dtypes import as_dtype
from gdn_export.modules.fused_linear import project_together
from gdn_export.modules.kv_cache import StepInputs
from gdn_export.modules.kv_cache_fp8 import write_and_attend
from gdn_export.modules.norm import ZeroCenteredRMSNorm
from gdn_export.modules.quant_linear import Fp8Linear
from gdn_export.modules.rotary import apply_rotary
from gdn_export.ops.attention import (attention, attention_at, decode_shaped, kv_cache_update, slot_index,
                                      write_kv_cache_)
from gdn_export.ops.backends import exporting
from gdn_export.ops.output_gate import fused_ready as output_gate_ready, output_gate, output_gate_quantized
from gdn_export.ops.quant_linear import fp8_linear_quantized, prequantized_ready


def causal_mask(t: int, past: int | torch.SymInt, device: torch.device) -> torch.Tensor:
    """[T, P+T] bool, True where query i may read key j (j <= P + i)."""
    q_pos = torch.arange(t, device=device) + past
    k_pos = torch.arange(t + past, device=device)
    return k_pos[None, :] <= q_pos[:, None]


class GatedAttention(nn.Module):
    """Causal GQA attention with per-head output gate, q/k RMSNorm and partial rope.

    forward(x [B, T, hidden], step: StepInputs, past_key, past_value) -> (out [B, T, hidden], key,
    value), all in x's dtype; K/V shapes as the layout says (see forward).
    """

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.gated = config.attn_output_gate
        self.scaling = self.head_dim**-0.5
        hidden, bias = config.hidden_size, config.attention_bias
        q_out = self.num_heads * self.head_dim * (2 if self.gated else 1)
        self.q_proj = nn.Linear(hidden, q_out, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = ZeroCenteredRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        # (k_scale, v_scale) of an FP8 K/V cache, else None (gdn_export.modules.kv_cache_fp8)
        self.kv_scales: tuple[float, float] | None = None

    def fusible_linears(self) -> list[tuple[nn.Linear, ...]]:
        """q / k / v projections: one GEMM after fuse_linears (runtime only)."""
        return [(self.q_proj, self.k_proj, self.v_proj)]

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, T, hidden] -> q [B, H, T, D], k, v [B, Hkv, T, D] (normed, rotated) and the output
        gate [B, T, H, D] (None without `attn_output_gate`). Families override this alone."""
        B, T, _ = x.shape
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = project_together(x, self.q_proj, self.k_proj, self.v_proj)
        gate = None
        if self.gated:
            # The checkpoint interleaves per head: [q_0 | gate_0 | q_1 | gate_1 | ...].
            q, gate = q.reshape(B, T, H, 2 * D).chunk(2, dim=-1)  # gate: a [B, T, H, D] view
        q = self.q_norm(q.reshape(B, T, H, D)).transpose(1, 2)  # [B, H, T, D]
        k = self.k_norm(k.reshape(B, T, Hkv, D)).transpose(1, 2)  # [B, Hkv, T, D]
        v = v.reshape(B, T, Hkv, D).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return q, k, v, gate

    def forward(self, x: torch.Tensor, step: StepInputs, past_key: torch.Tensor,
                past_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, hidden] -> (out [B, T, hidden], key, value). In-place layout: key / value are
        the caches [B, Hkv, L, D], updated in place in eager mode; concat layout: [B, Hkv, P+T, D]."""
        B, T, _ = x.shape
        q, k, v, gate = self.project(x, step.cos, step.sin)
        if step.write_index is None:
            o, key, value = self._attend_concat(q, k, v, past_key, past_value)
        elif self.kv_scales is not None:
            o, key, value = write_and_attend(q, k, v, past_key, past_value, step, self.scaling, self.kv_scales, _kept)
        else:
            key, value = _write(past_key, past_value, k, v, step)
            if exporting() or decode_shaped(q, key):  # the graph's form (ONNX Attention); decode steps
                o = attention(q, key, value, step.attn_mask, self.scaling)  # (a small mask, built once)
            else:  # prefill: the mask from positions, inside the kernels (no [B, 1, T, L] tensor)
                o = attention_at(q, key, value, step.past_lengths, self.scaling, step.sinks, step.window)
        if gate is not None:  # [B, H, T, D] -> [B, T, H D] times sigmoid(gate): one kernel in eager GPU runs
            o_proj = self.o_proj
            if (isinstance(o_proj, Fp8Linear) and prequantized_ready(o, o_proj.weight, o_proj.bias)
                    and output_gate_ready(o, gate)):
                # prefill rows into an FP8 o_proj: the gate kernel writes the projection's FP8 input too
                o, oq, row_scale = output_gate_quantized(o, gate, o_proj.input_scale)
                return fp8_linear_quantized(o, oq, row_scale, o_proj.weight, o_proj.weight_scale, o_proj.input_scale,
                                            o_proj.bias), key, value
            o = output_gate(o, gate)
        else:
            o = o.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)
        return self.o_proj(o), key, value

    def _attend_concat(self, q, k, v, past_key, past_value):
        """The concat layout: K/V grow by the new tokens; rows share the past length P."""
        B, H, T, D = q.shape
        Hkv = self.num_kv_heads
        key = torch.cat((past_key.to(k.dtype), k), dim=2)  # [B, Hkv, P+T, D]
        value = torch.cat((past_value.to(v.dtype), v), dim=2)
        past = past_key.shape[2]
        # GQA without materialising repeated K/V: query head h = kv * G + g reads kv head h // G.
        G = H // Hkv
        qg = q.reshape(B, Hkv, G, T, D)
        scores = torch.matmul(qg, key[:, :, None].transpose(-1, -2)) * self.scaling  # [B, Hkv, G, T, P+T]
        mask = causal_mask(T, past, q.device)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
        o = torch.matmul(probs, value[:, :, None])  # [B, Hkv, G, T, D]
        return o.reshape(B, H, T, D), key, value


def _write(key_cache: torch.Tensor, value_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           step: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Write a layer's new K and V [B, Hkv, T, D] into its caches at the rows' slots: in place
    (one gdn::write_kv_cache_ call, which torch.compile keeps in place) unless exporting, where
    they are the functional op (ONNX TensorScatter). Returns the caches to attend over."""
    k, v = _kept(key_cache, k, step), _kept(value_cache, v, step)
    if exporting():
        return (kv_cache_update(key_cache, k, step.write_index),
                kv_cache_update(value_cache, v, step.write_index))
    write_kv_cache_(key_cache, value_cache, k, v, step.write_index)
    return key_cache, value_cache


def _kept(cache: torch.Tensor, update: torch.Tensor, step: StepInputs) -> torch.Tensor:
    """update in the cache's dtype; streaming (step.keep_old): padded tokens write back what their
    slot holds, so ring entries that a later window still needs survive (gdn_export.modules.kv_cache)."""
    update = as_dtype(update, cache.dtype)
    if step.keep_old:
        index = slot_index(cache, update, step.write_index)
        if cache.dtype == torch.float8_e4m3fn and not exporting():  # no CPU gather kernel for float8
            old = torch.gather(cache.view(torch.uint8), 2, index).view(cache.dtype)
        else:
            old = torch.gather(cache, 2, index)
        update = torch.where(step.token_mask[:, None, :, None], update, old)
    return update
