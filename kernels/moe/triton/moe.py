"""Routed experts (gdn::moe): fused routing, then a grouped GEMM over each expert's own tokens.

    route     one program per token: softmax over E in fp32, top-k by repeated argmax, renormalise;
              each (token, slot) pair takes a row of its expert's list with an atomic counter
              (rows[e, r] = pair, r < counts[e]), so no sort and no host sync
    gate_up   program (row block, I block): the block's expert e and rows come from counts
              (cumsum of ceil(counts / BM) over E); act = silu(x W_gate^T) * (x W_up^T), both
              halves in one program so the SwiGLU is fused
    down      program (row block, H block): y[pair] = w_pair * act W_down^T
    combine   out[n] = sum_j y[n * k + j]  (torch sum in fp32, cast to hidden's dtype)

Only the blocks of experts with rows do any work, so at decode only the routed experts' weights
are read. The grid is the static bound cdiv(N k, BM) + min(N k, E) row blocks (every hit expert
wastes at most one partial block); blocks past the last expert return at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.triton_utils import cdiv, next_pow2, to_state_dtype
# ieee for fp32 operands; 16-bit operands widened under the CPU interpreter (bf16 dot bug there)
from kernels.triton_utils import dot


@triton.jit
def moe_route_kernel(logits, ids, weights, rows, counts, N, E,
                     K: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr, NORM: tl.constexpr):
    i_n = tl.program_id(0)
    o_e = tl.arange(0, BE)
    m_e = o_e < E
    b_l = tl.load(logits + i_n.to(tl.int64) * E + o_e, mask=m_e, other=float("-inf")).to(tl.float32)
    b_x = tl.exp(b_l - tl.max(b_l, 0))
    b_p = tl.where(m_e, b_x / tl.sum(b_x, 0), -1.0)  # -1: padding is never picked
    o_k = tl.arange(0, BK)
    b_w = tl.zeros([BK], dtype=tl.float32)
    for j in tl.static_range(K):
        i_e = tl.argmax(b_p, 0, tie_break_left=True)
        b_w = tl.where(o_k == j, tl.max(b_p, 0), b_w)
        b_p = tl.where(o_e == i_e, -1.0, b_p)
        r = tl.atomic_add(counts + i_e, 1)
        # an expert appears at most once per token: N rows per expert always suffice
        tl.store(rows + i_e.to(tl.int64) * N + r, i_n * K + j)
        tl.store(ids + i_n * K + j, i_e)
    if NORM:
        b_w = b_w / tl.sum(b_w, 0)
    tl.store(weights + i_n * K + o_k, b_w, mask=o_k < K)


@triton.jit
def _expert_block(counts, E, i_b, BE: tl.constexpr, BM: tl.constexpr):
    # (expert, first row) of row block i_b; expert >= E when i_b is past the last used block
    o_e = tl.arange(0, BE)
    b_nb = (tl.load(counts + o_e, mask=o_e < E, other=0) + BM - 1) // BM
    b_end = tl.cumsum(b_nb, 0)
    i_e = tl.sum((b_end <= i_b).to(tl.int32), 0)
    start = tl.sum(tl.where(o_e < i_e, b_nb, 0), 0)
    return i_e, (i_b - start) * BM


@triton.jit
def moe_gate_up_kernel(x, gate_up, rows, counts, act, N, H, I, E,
                       K: tl.constexpr, BE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, IEEE: tl.constexpr):
    i_b, i_i = tl.program_id(0), tl.program_id(1)
    i_e, r0 = _expert_block(counts, E, i_b, BE, BM)
    if i_e < E:
        o_m = r0 + tl.arange(0, BM)
        m_m = o_m < tl.load(counts + i_e)
        b_pair = tl.load(rows + i_e.to(tl.int64) * N + o_m, mask=m_m, other=0)
        p_x = x + (b_pair // K).to(tl.int64)[:, None] * H
        o_n = i_i * BN + tl.arange(0, BN)
        m_n = o_n < I
        p_g = gate_up + i_e.to(tl.int64) * 2 * I * H + o_n[None, :].to(tl.int64) * H
        p_u = p_g + I.to(tl.int64) * H
        b_g = tl.zeros([BM, BN], dtype=tl.float32)
        b_u = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(0, H, BK):
            o_k = k0 + tl.arange(0, BK)
            m_k = o_k < H
            b_x = tl.load(p_x + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0)
            m_w = m_k[:, None] & m_n[None, :]
            b_wg = tl.load(p_g + o_k[:, None], mask=m_w, other=0)
            b_wu = tl.load(p_u + o_k[:, None], mask=m_w, other=0)
            b_g += dot(b_x, b_wg, IEEE)
            b_u += dot(b_x, b_wu, IEEE)
        b_a = b_g * tl.sigmoid(b_g) * b_u
        tl.store(act + b_pair.to(tl.int64)[:, None] * I + o_n[None, :], to_state_dtype(b_a, act.dtype.element_ty),
                 mask=m_m[:, None] & m_n[None, :])


@triton.jit
def moe_down_kernel(act, down, weights, rows, counts, y, N, H, I, E,
                    BE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    IEEE: tl.constexpr):
    i_b, i_h = tl.program_id(0), tl.program_id(1)
    i_e, r0 = _expert_block(counts, E, i_b, BE, BM)
    if i_e < E:
        o_m = r0 + tl.arange(0, BM)
        m_m = o_m < tl.load(counts + i_e)
        b_pair = tl.load(rows + i_e.to(tl.int64) * N + o_m, mask=m_m, other=0).to(tl.int64)
        o_n = i_h * BN + tl.arange(0, BN)
        m_n = o_n < H
        p_d = down + i_e.to(tl.int64) * H * I + o_n[None, :].to(tl.int64) * I
        b_y = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(0, I, BK):
            o_k = k0 + tl.arange(0, BK)
            m_k = o_k < I
            b_a = tl.load(act + b_pair[:, None] * I + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0)
            b_w = tl.load(p_d + o_k[:, None], mask=m_k[:, None] & m_n[None, :], other=0)
            b_y += dot(b_a, b_w, IEEE)
        b_y *= tl.load(weights + b_pair, mask=m_m, other=0)[:, None]
        tl.store(y + b_pair[:, None] * H + o_n[None, :], to_state_dtype(b_y, y.dtype.element_ty),
                 mask=m_m[:, None] & m_n[None, :])


def _tiles(pairs: int, H: int, I: int) -> dict:
    """Tile sizes: 16-row blocks while experts get a few rows each (decode: weight-bound, narrow
    column blocks so that enough programs stream weights), 64-row blocks for prefill (FLOP-bound).
    Chosen by reasoning, not yet swept on the H200 (benchmarks/moe_bench.py measures them)."""
    decode = pairs <= 1024
    fit = lambda cap, n: min(cap, max(16, next_pow2(n)))  # noqa: E731
    return dict(BM=16 if decode else 64, BN1=fit(32 if decode else 64, I), BN2=fit(64 if decode else 128, H),
                BK1=fit(128 if decode else 64, H), BK2=fit(128 if decode else 64, I), stages=4 if decode else 3)



@dataclass
class Routing:
    """route()'s buffers: ids [N, k] int32, weights [N, k] fp32, rows [E * max(N, 1)] int32 (each
    expert's routed (token, slot) pairs), counts [E] int32, act [N*k, I] and y [N*k, H] in the
    activation dtype (filled by the expert kernels), and the launch plan (BE, tiles, blocks)."""

    ids: torch.Tensor
    weights: torch.Tensor
    rows: torch.Tensor
    counts: torch.Tensor
    act: torch.Tensor
    y: torch.Tensor
    BE: int
    tiles: dict
    blocks: int


def route(router_logits, top_k: int, norm_topk_prob: bool, H: int, I: int, dtype: torch.dtype) -> Routing:
    """Top-k routing of router_logits [N, E] by moe_route_kernel (launched when N > 0) and the
    buffers and tile plan the expert kernels share (16-bit and quantized experts alike)."""
    N, E = router_logits.shape
    logits = router_logits.contiguous()
    dev, pairs = logits.device, N * top_k
    counts = torch.zeros(E, dtype=torch.int32, device=dev)
    rows = torch.empty(E * max(N, 1), dtype=torch.int32, device=dev)
    ids = torch.empty(N, top_k, dtype=torch.int32, device=dev)
    weights = torch.empty(N, top_k, dtype=torch.float32, device=dev)
    act = torch.empty(pairs, I, dtype=dtype, device=dev)
    y = torch.empty(pairs, H, dtype=dtype, device=dev)
    BE = next_pow2(E)
    if N > 0:
        moe_route_kernel[(N,)](logits, ids, weights, rows, counts, N, E,
                               K=top_k, BE=BE, BK=next_pow2(top_k), NORM=bool(norm_topk_prob))
    t = _tiles(pairs, H, I)
    return Routing(ids, weights, rows, counts, act, y, BE, t, cdiv(pairs, t["BM"]) + min(pairs, E))


def moe(
    hidden: torch.Tensor,
    router_logits: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    norm_topk_prob: bool = True,
    return_routing: bool = False,
):
    """Routed SwiGLU experts (see gdn_export.ops.moe for the contract).

    Args:
        hidden [N, H] fp32 / fp16 / bf16 (fp64 runs in fp32); router_logits [N, E] any float;
        gate_up [E, 2I, H] and down [E, H, I], cast to hidden's dtype when they differ (that
        reads every expert: keep them in hidden's dtype). top_k in [1, E].
    Returns:
        out [N, H] in hidden's dtype; with return_routing also (ids [N, k] int32, weights [N, k] fp32).
    """
    N, H = hidden.shape
    E, I = gate_up.shape[0], down.shape[2]
    if tuple(gate_up.shape) != (E, 2 * I, H) or tuple(down.shape) != (E, H, I) or router_logits.shape != (N, E):
        raise ValueError(f"moe: shapes hidden {tuple(hidden.shape)} router_logits {tuple(router_logits.shape)} "
                         f"gate_up {tuple(gate_up.shape)} down {tuple(down.shape)} break the contract")
    if not 1 <= top_k <= E:
        raise ValueError(f"moe: top_k must be in [1, E={E}], got {top_k}")
    dtype = torch.float32 if hidden.dtype == torch.float64 else hidden.dtype
    x = hidden.to(dtype).contiguous()
    gate_up, down = (w if w.dtype == dtype and w.is_contiguous() else w.to(dtype).contiguous()
                     for w in (gate_up, down))
    r = route(router_logits, top_k, norm_topk_prob, H, I, dtype)
    ids, weights, rows, counts, act, y = r.ids, r.weights, r.rows, r.counts, r.act, r.y
    if N > 0:
        BE, t, blocks = r.BE, r.tiles, r.blocks
        ieee = dtype == torch.float32
        moe_gate_up_kernel[(blocks, cdiv(I, t["BN1"]))](
            x, gate_up, rows, counts, act, N, H, I, E, K=top_k, BE=BE, BM=t["BM"], BN=t["BN1"],
            BK=t["BK1"], IEEE=ieee, num_warps=4, num_stages=t["stages"])
        moe_down_kernel[(blocks, cdiv(H, t["BN2"]))](
            act, down, weights, rows, counts, y, N, H, I, E, BE=BE, BM=t["BM"], BN=t["BN2"],
            BK=t["BK2"], IEEE=ieee, num_warps=4, num_stages=t["stages"])
    out = y.view(N, top_k, H).sum(1, dtype=torch.float32).to(hidden.dtype)
    return (out, ids, weights) if return_routing else out
