"""Golden fp32 references of the gated delta rule.

Two independent formulations that must agree with each other:

* `recurrent_gated_delta_rule`: the step-by-step recurrence, one token at a time;
* `chunked_gated_delta_rule`: the chunkwise WY form used for prefill, where the recurrence inside
  a chunk becomes a triangular solve and matrix products.

Per value head h (key head h // (Hv // Hk)) and token t, with a_t = exp(g_t), state S [Dk, Dv]:

    S   <- a_t * S
    u_t  = beta_t * (v_t - S^T k_t)
    S   <- S + k_t u_t^T                    (= a_t S (I - beta_t k_t k_t^T) + beta_t k_t v_t^T)
    o_t  = scale * S^T q_t

Every fast backend is tested against these. They compute in fp32 (float64 if given float64) and
return `o` in v's dtype and the state in its storage dtype (initial_state's: fp32, fp16 or bf16;
fp32 for None or float64), rounded once where it is stored, at the end of the call (per sequence
when packed): the rounding rule of the op (gdn_export.ops.gated_delta_rule), which the kernels
follow by keeping the state on-chip in fp32 for the whole call.
"""

from __future__ import annotations

import torch

from gdn_export.ops.gated_delta_rule import state_storage_dtype

L2NORM_EPS = 1e-6


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last axis (the convention of the reference models)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prepare(q, k, v, g, beta, initial_state, scale, use_qk_l2norm):
    """Upcast, normalise, scale and repeat key heads to value heads: all as [B, Hv, T, D]."""
    compute = torch.float64 if v.dtype == torch.float64 else torch.float32
    q, k, v, g, beta = (x.to(compute) for x in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    group = v.shape[2] // q.shape[2]
    q = q.repeat_interleave(group, dim=2) * scale
    k = k.repeat_interleave(group, dim=2)
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [B, Hv, T, D]
    g, beta = g.transpose(1, 2), beta.transpose(1, 2)  # [B, Hv, T]
    B, H, _, Dk = k.shape
    Dv = v.shape[-1]
    if initial_state is None:
        state = torch.zeros(B, H, Dk, Dv, dtype=compute, device=v.device)
    else:
        state = initial_state.to(compute).clone()
    return q, k, v, g, beta, state


def _per_sequence(fn, q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens):
    """Run `fn` on each sequence of a packed batch ([1, total_T, ...] with cu_seqlens [N + 1])."""
    outs, states = [], []
    bounds = cu_seqlens.tolist()
    for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        init = None if initial_state is None else initial_state[n : n + 1]
        # an empty sequence keeps its state: the token loop runs zero times (no chunks to reshape)
        o, s = (fn if end > start else recurrent_gated_delta_rule)(
            q[:, start:end], k[:, start:end], v[:, start:end], g[:, start:end],
            beta[:, start:end], init, scale, use_qk_l2norm,
        )
        outs.append(o)
        states.append(s)
    return torch.cat(outs, dim=1), torch.cat(states, dim=0)


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token gated delta rule.

    Args:
        q, k: [B, T, Hk, Dk]. v: [B, T, Hv, Dv] with Hv a multiple of Hk.
        g: [B, T, Hv] log of the decay a_t (<= 0). beta: [B, T, Hv] write strength in (0, 1).
        initial_state: [N, Hv, Dk, Dv] or None (zeros); N = B, or the number of sequences.
        scale: multiplies q; default Dk ** -0.5.
        use_qk_l2norm: L2-normalise q and k over Dk first.
        cu_seqlens: [N + 1] sequence starts of a packed batch (B must be 1), or None.
    Returns:
        o [B, T, Hv, Dv] in v's dtype, final_state [N, Hv, Dk, Dv] in the state's storage dtype
        (initial_state's; fp32 for None), rounded once at the end (the op's rounding rule).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if cu_seqlens is not None:
        return _per_sequence(recurrent_gated_delta_rule, q, k, v, g, beta, initial_state,
                             scale, use_qk_l2norm, cu_seqlens)
    out_dtype, state_dtype = v.dtype, state_storage_dtype(initial_state)
    q, k, v, g, beta, state = _prepare(q, k, v, g, beta, initial_state, scale, use_qk_l2norm)
    o = torch.empty_like(v)
    for t in range(v.shape[2]):
        state, o[:, :, t] = _token(state, q, k, v, g, beta, t)
    return o.transpose(1, 2).to(out_dtype), state.to(state_dtype)


def _token(state, q, k, v, g, beta, t: int):
    """Token t of prepared [B, H, T, D] inputs: (the state after it [B, H, Dk, Dv], o_t [B, H, Dv])."""
    state = state * g[:, :, t, None, None].exp()
    k_t = k[:, :, t]  # [B, H, Dk]
    u = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhkv,bhk->bhv", state, k_t))
    state = state + k_t[..., :, None] * u[..., None, :]
    return state, torch.einsum("bhkv,bhk->bhv", state, q[:, :, t])


def recurrent_gated_delta_rule_steps(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token gated delta rule keeping the state after every token (the contract of
    gdn_export.ops.gated_delta_rule.steps): arguments as `recurrent_gated_delta_rule` without
    cu_seqlens. Each token's state is rounded to the storage dtype and the next token starts from
    the rounded value, as T calls of one token would.

    Returns o [B, T, Hv, Dv] in v's dtype and states [B, T, Hv, Dk, Dv] in the state's storage
    dtype: states[:, t] after token t.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out_dtype, state_dtype = v.dtype, state_storage_dtype(initial_state)
    q, k, v, g, beta, state = _prepare(q, k, v, g, beta, initial_state, scale, use_qk_l2norm)
    compute = state.dtype
    o = torch.empty_like(v)
    states = []
    for t in range(v.shape[2]):
        state, o[:, :, t] = _token(state, q, k, v, g, beta, t)
        stored = state.to(state_dtype)
        states.append(stored)
        state = stored.to(compute)
    return o.transpose(1, 2).to(out_dtype), torch.stack(states, dim=1)


def chunked_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunkwise (WY representation) gated delta rule; same contract as the recurrent form.

    Inside a chunk of C tokens with cumulative log decay G_i = sum_{j<=i} g_j, the C sequential
    rank-1 updates collapse into a unit lower-triangular system (I + A) W = diag(beta) (...),
    A_ij = beta_i k_i.k_j exp(G_i - G_j) for i > j, so that the chunk needs one triangular solve
    and a handful of matrix products instead of C dependent steps.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if cu_seqlens is not None:
        return _per_sequence(
            lambda *a: chunked_gated_delta_rule(*a, chunk_size=chunk_size),
            q, k, v, g, beta, initial_state, scale, use_qk_l2norm, cu_seqlens,
        )
    out_dtype, state_dtype = v.dtype, state_storage_dtype(initial_state)
    T = v.shape[1]
    q, k, v, g, beta, state = _prepare(q, k, v, g, beta, initial_state, scale, use_qk_l2norm)
    pad = (-T) % chunk_size
    if pad:
        # Padded tokens have beta = 0 and g = 0: they neither write nor decay the state.
        q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (torch.nn.functional.pad(x, (0, pad)) for x in (g, beta))
    B, H, Tp, Dk = k.shape
    n, C = Tp // chunk_size, chunk_size
    q, k, v = (x.reshape(B, H, n, C, -1) for x in (q, k, v))
    g, beta = (x.reshape(B, H, n, C) for x in (g, beta))
    G = g.cumsum(-1)  # [B, H, n, C]
    eye = torch.eye(C, dtype=k.dtype, device=k.device)
    strictly_lower = torch.ones(C, C, dtype=torch.bool, device=k.device).tril(-1)
    lower = strictly_lower | eye.bool()
    # decay[i, j] = exp(G_i - G_j) on and below the diagonal, 0 above (masked before exp).
    diff = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, float("-inf"))
    decay = diff.exp()
    kk = k @ k.transpose(-1, -2)
    A = (beta[..., :, None] * kk * decay).masked_fill(~strictly_lower, 0)
    # (I + A) is unit lower triangular; solving it gives the WY factors of the chunk.
    IA = eye + A
    w = torch.linalg.solve_triangular(IA, beta[..., None] * k * G[..., None].exp(), upper=False,
                                      unitriangular=True)
    u = torch.linalg.solve_triangular(IA, beta[..., None] * v, upper=False, unitriangular=True)
    qk = (q @ k.transpose(-1, -2)) * decay  # causal, including the diagonal
    o = torch.empty_like(v)
    for c in range(n):
        v_new = u[:, :, c] - w[:, :, c] @ state  # [B, H, C, Dv]
        o[:, :, c] = (q[:, :, c] * G[:, :, c, :, None].exp()) @ state + qk[:, :, c] @ v_new
        last = G[:, :, c, -1]
        k_decayed = k[:, :, c] * (last[..., None] - G[:, :, c]).exp()[..., None]
        state = state * last.exp()[..., None, None] + k_decayed.transpose(-1, -2) @ v_new
    o = o.reshape(B, H, Tp, -1)[:, :, :T]
    return o.transpose(1, 2).to(out_dtype), state.to(state_dtype)
