"""Gated DeltaNet mixer (linear attention) of Qwen3-Next / Qwen3.5 (OLMo-Hybrid subclasses it).

Hk key heads of size Dk, Hv = m * Hk value heads of size Dv, conv kernel K:

    q, k [Hk, Dk], v, z [Hv, Dv], b, a [Hv]   from the input projections (two layouts, below)
    q|k|v = silu(causal_conv1d(q|k|v))         channels in that order, rolling state [C, K-1]
    beta  = sigmoid(b) * beta_scale            (beta_scale 1; OLMo-Hybrid's 2 allows negative eigenvalues)
    g     = -exp(A_log) * softplus(a + dt_bias)  (fp32; log decay <= 0)
    o     = gated_delta_rule(q, k, v, g, beta, state, use_qk_l2norm=True)   [Hv, Dv]
    out   = out_proj(gated_rmsnorm(o, z))       per value head

Projection layouts:

* Qwen3.5 (split): in_proj_qkv gives q|k|v flat (all q heads, then k, then v); in_proj_z, in_proj_b,
  in_proj_a give z, b, a with value head h at position h.
* Qwen3-Next (fused): in_proj_qkvz groups its outputs per key head kh:
  [q_kh (Dk) | k_kh (Dk) | v of heads kh*m .. kh*m+m-1 (m*Dv) | z of the same heads (m*Dv)], and
  in_proj_ba per key head: [b of its m value heads | a of its m value heads].

In both, value head h belongs to key head h // m, which is the `gdn::gated_delta_rule` convention,
so the key heads go to the op un-repeated.

Families differ only in the projections, the beta scaling and the output (norm + projection); a
subclass overrides `make_projections`, `project`, `make_output`, `output` and/or sets `beta_scale`, while the
call sequence conv -> split -> gates -> gated_delta_rule -> output stays in the one `forward` here
(see gdn_export.modules.olmo_hybrid).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gdn_export.config import HybridConfig
from gdn_export.ops.dtypes import as_dtype
from gdn_export.modules.fused_linear import project_together
from gdn_export.modules.kv_cache import StepInputs
from gdn_export.modules.norm import GatedRMSNorm
from gdn_export.ops import backends, causal_conv1d, gated_delta_rule
from gdn_export.ops.gated_delta_rule import gated_delta_rule_
from gdn_export.ops.gated_delta_rule.gating import gdn_gating
from gdn_export.ops.gated_delta_rule.steps import gated_delta_rule_steps


class GatedDeltaNet(nn.Module):
    """forward(x [B, T, hidden], conv_state [B, C, K-1], recurrent_state [B, Hv, Dk, Dv] S)
    -> (out [B, T, hidden], new conv_state [B, C, K-1] in x's dtype, new recurrent_state S).

    S, the state's storage dtype (fp32, fp16 or bf16), is kept: the op computes in fp32 and rounds
    the state once per call where it stores it (see gdn_export.ops.gated_delta_rule).

    C = 2*Hk*Dk + Hv*Dv. `layout` is "fused" (Qwen3-Next) or "split" (Qwen3.5, Qwen3.5-MoE).

    With step.capture_steps (the verify form of speculative decoding) the two states returned are
    the conv window [B, C, K-1+T] (the old conv state, then the T new conv inputs) and the
    recurrent state after every token [B, T, Hv, Dk, Dv] S (gdn_export.ops.gated_delta_rule.steps).
    """

    LAYOUTS = ("fused", "split")

    def __init__(self, config: HybridConfig, layer_idx: int, layout: str | None = None) -> None:
        super().__init__()
        layout = layout or ("fused" if config.family == "qwen3_next" else "split")
        if layout not in self.LAYOUTS:
            raise ValueError(f"layout must be one of {self.LAYOUTS}, got {layout!r}")
        self.layout = layout
        self.layer_idx = layer_idx
        self.num_k_heads = Hk = config.linear_num_key_heads
        self.num_v_heads = Hv = config.linear_num_value_heads
        self.head_k_dim = Dk = config.linear_key_head_dim
        self.head_v_dim = Dv = config.linear_value_head_dim
        self.key_dim, self.value_dim = Hk * Dk, Hv * Dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_kernel_size = config.linear_conv_kernel_dim
        self.make_projections(config)
        # Depthwise conv weight kept as [C, 1, K] (the checkpoint's shape); the op takes [C, K].
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.conv_kernel_size,
                                groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(Hv))
        self.A_log = nn.Parameter(torch.zeros(Hv))
        self.make_output(config)
        # True (set by gdn_export.runtime.cuda_graph.GraphRunner, never for export): the conv and
        # recurrent states given to forward are updated in place and returned, so that a captured
        # decode step reads and writes the same buffers (no copy of the states per step).
        self.update_states_in_place = False

    # ------------------------------------------------------------------ family hooks
    def make_projections(self, config: HybridConfig) -> None:
        """Create the input projections that `project` uses."""
        hidden, Hv = config.hidden_size, self.num_v_heads
        if self.layout == "fused":
            self.in_proj_qkvz = nn.Linear(hidden, 2 * self.key_dim + 2 * self.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(hidden, 2 * Hv, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(hidden, self.conv_dim, bias=False)
            self.in_proj_z = nn.Linear(hidden, self.value_dim, bias=False)
            self.in_proj_b = nn.Linear(hidden, Hv, bias=False)
            self.in_proj_a = nn.Linear(hidden, Hv, bias=False)

    def fusible_linears(self) -> list[tuple[nn.Linear, ...]]:
        """The input projections `project` runs as one GEMM after fuse_linears (runtime only)."""
        if self.layout == "fused":
            return [(self.in_proj_qkvz, self.in_proj_ba)]
        return [(self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)]

    def make_output(self, config: HybridConfig) -> None:
        """Create the output norm and projection that `output` uses."""
        self.norm = GatedRMSNorm(self.head_v_dim, eps=config.gdn_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, config.hidden_size, bias=False)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, hidden] -> (mixed_qkv [B, T, C], z [B, T, Hv, Dv], b [B, T, Hv], a [B, T, Hv])."""
        B, T, _ = x.shape
        Hk, Hv, Dk, Dv = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        if self.layout == "split":
            mixed, z, b, a = project_together(x, self.in_proj_qkv, self.in_proj_z, self.in_proj_b,
                                              self.in_proj_a)
            return mixed, z.reshape(B, T, Hv, Dv), b, a
        m = Hv // Hk
        qkvz, ba = project_together(x, self.in_proj_qkvz, self.in_proj_ba)
        q, k, v, z = torch.split(qkvz.reshape(B, T, Hk, 2 * Dk + 2 * m * Dv), [Dk, Dk, m * Dv, m * Dv], dim=-1)
        b, a = torch.split(ba.reshape(B, T, Hk, 2 * m), [m, m], dim=-1)
        mixed = torch.cat((q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)), dim=-1)
        return mixed, z.reshape(B, T, Hv, Dv), b.reshape(B, T, Hv), a.reshape(B, T, Hv)

    # beta = sigmoid(b) * beta_scale: 2.0 lets the delta rule's eigenvalues go negative (OLMo-Hybrid)
    beta_scale = 1.0

    def gates(self, a: torch.Tensor, b: torch.Tensor, token_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g fp32, beta in b's dtype) [B, T, Hv] from the a / b projections: g = -exp(A_log)
        softplus(a + dt_bias), beta = sigmoid(b) * beta_scale; a padded token (token_mask [B, T]
        False) gets g = 0, beta = 0, an exact identity step that leaves the state at its row's last
        real token (gdn_export.ops.gated_delta_rule.gating: one fused kernel in eager GPU runs)."""
        return gdn_gating(a, b, self.A_log, self.dt_bias, token_mask, self.beta_scale)

    def output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """o, z [B, T, Hv, Dv] -> out_proj(gated_rmsnorm(o, z)) [B, T, hidden]."""
        return self.norm.project(o, z, self.out_proj)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        x: torch.Tensor,
        step: StepInputs,
        conv_state: torch.Tensor,
        recurrent_state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        mixed, z, b, a = self.project(x)
        if step.capture_steps:
            # The verify form: the conv state after any prefix of the T tokens is a slice of this
            # window [B, C, K-1+T] (gdn_export.models.verify.roll_back picks it).
            conv_window = torch.cat((as_dtype(conv_state, mixed.dtype), mixed.transpose(1, 2)), dim=-1)
        if step.capture_steps and backends.exporting():
            # The verify graph: the conv over the window as a grouped Conv (standard ONNX), whose
            # state input no in-place plugin also updates (TensorRT cannot copy an aliased
            # network input that another layer reads).
            mixed = F.silu(F.conv1d(conv_window, self.conv1d.weight.to(mixed.dtype), groups=mixed.shape[-1]))
            mixed = mixed.transpose(1, 2)
        else:
            mixed, new_conv_state = causal_conv1d(
                mixed, self.conv1d.weight[:, 0, :], None, as_dtype(conv_state, mixed.dtype), silu=True,
                seq_lens=step.seq_lens_int32(),
            )
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(B, T, self.num_k_heads, self.head_k_dim)
        k = k.reshape(B, T, self.num_k_heads, self.head_k_dim)
        v = v.reshape(B, T, self.num_v_heads, self.head_v_dim)

        g, beta = self.gates(a, b, step.token_mask)
        if step.capture_steps:
            o, recurrent_steps = gated_delta_rule_steps(q, k, v, g, beta, initial_state=recurrent_state,
                                                        use_qk_l2norm=True)
            return self.output(o, z), conv_window, recurrent_steps
        if self.update_states_in_place:
            o = gated_delta_rule_(q, k, v, g, beta, recurrent_state, use_qk_l2norm=True)
            new_recurrent_state = recurrent_state
            new_conv_state = conv_state.copy_(new_conv_state)
        else:
            o, new_recurrent_state = gated_delta_rule(
                q, k, v, g, beta, initial_state=recurrent_state, use_qk_l2norm=True
            )
        return self.output(o, z), new_conv_state, new_recurrent_state
