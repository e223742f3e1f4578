"""MoE test inputs shared by the MoE and quantized-MoE tests."""

from __future__ import annotations

import torch


def moe_inputs(N, H, E, I, dtype=torch.float32, seed=0, device="cpu"):
    """Fresh hidden [N, H], router_logits [N, E], gate_up [E, 2I, H], down [E, H, I] (never zeros),
    drawn on `device` (real-size experts are GiBs: drawn on the GPU in milliseconds).

    Each token's logits are a random permutation of 4, 3.75, 3.5, ... (32 values, exact in bf16 /
    fp16) followed by values below -5: the top 32 never tie in any dtype, so every implementation
    must pick the same top-k (with Gaussian fp16 logits a tie at the k-th place made routing, not
    arithmetic, differ).
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    kw = dict(generator=gen, device=device)
    hidden = torch.randn(N, H, **kw)
    grid = 4.0 - 0.25 * torch.arange(E, dtype=torch.float32, device=device)
    grid[32:] = -5.0 - torch.rand(max(E - 32, 0), **kw)
    logits = grid[torch.argsort(torch.rand(N, E, **kw), dim=-1)]
    gate_up = torch.randn(E, 2 * I, H, **kw).mul_(H**-0.5).to(dtype)
    down = torch.randn(E, H, I, **kw).mul_(I**-0.5).to(dtype)
    return hidden.to(dtype), logits.to(dtype), gate_up, down
