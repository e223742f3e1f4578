"""Quantized-MoE contract cases (gdn::moe_fp8 / gdn::moe_int4): sizes, weight forms, their inputs and
the checker. Inputs: tests.ops.moe.inputs.moe_inputs (routing that never ties) with the
expert weights quantized here by plain torch formulas (per-row FP8, 128-block FP8, INT4 groups), and
static FP8 activation scales that clamp part of the activations (amax / 448 times 0.5 .. 1.5)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tests.conftest import fp32_products, rel_rms
from tests.ops.moe.inputs import moe_inputs

ALL = (torch.float32, torch.bfloat16, torch.float16)
# relative RMS of out against the fp32 reference, per (form has static activations, dtype): see
# gdn_export.ops.moe_quant (an e4m3 rounding-boundary flip of the down input adds ~5e-4 in fp32).
BOUND = {(False, torch.float32): 1e-5, (False, torch.float16): 1e-2, (False, torch.bfloat16): 1e-2,
         (True, torch.float32): 5e-3, (True, torch.float16): 2e-2, (True, torch.bfloat16): 2e-2}
FORMS = ("fp8-static", "fp8-channel", "fp8-block", "int4-g128", "int4-g32", "int4-g6")  # g6: no K tile lies in one group


@dataclass(frozen=True)
class Case:
    name: str
    N: int
    H: int
    E: int
    I: int  # noqa: E741
    top_k: int
    norm: bool = True
    tags: frozenset = field(default_factory=lambda: frozenset({"small"}))


def _case(name, N, H, E, I, k, norm=True, tags=("small",)):  # noqa: E741
    return Case(name, N, H, E, I, k, norm, frozenset(tags))


CASES = [
    _case("N1-H40-E4-I24-k1", 1, 40, 4, 24, 1),
    _case("N7-H160-E5-I37-k3", 7, 160, 5, 37, 3),  # H: two 128-groups, the last partial; I odd
    _case("N65-H136-E8-I72-k2-nonorm", 65, 136, 8, 72, 2, norm=False),
    _case("N5-H8-E3-I4-k3-every-expert", 5, 8, 3, 4, 3),
    _case("N130-H64-E6-I48-k2", 130, 64, 6, 48, 2),
    # real sizes on the GPU (Qwen3.5-35B-A3B: H 2048, 256 experts of I 512, top 8)
    # ("big": 2 GiB of fp32 experts drawn and quantized on the GPU: tests/conftest.py _gpu_memory_slot)
    _case("decode-B1-qwen35", 1, 2048, 256, 512, 8, tags=("gpu", "big")),
    _case("decode-B32-qwen35", 32, 2048, 256, 512, 8, tags=("gpu", "big")),
    _case("prefill-T300-E64", 300, 2048, 64, 512, 8, tags=("gpu",)),
    _case("N33-H1000-E16-I300-k4-nonorm", 33, 1000, 16, 300, 4, norm=False, tags=("gpu",)),
]


def _per_expert(quantize):
    """quantize [1, N, K] -> (q, scale) applied expert by expert: the temporaries of one expert
    (not of all E: GiBs at real sizes) are alive at a time."""
    def run(W, *args):
        parts = [quantize(W[e:e + 1], *args) for e in range(W.shape[0])]
        return torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts])
    return run


@_per_expert
def fp8_weight(W: torch.Tensor, block: bool):
    """fp32 [E, N, K] -> (fp8, fp32 scale [E, N, 1] per row or [E, N, ceil(K/128)] per 128-group)."""
    E, N, K = W.shape
    if not block:
        s = W.abs().amax(-1, keepdim=True) / 448
        return (W / s).to(torch.float8_e4m3fn), s
    G = -(-K // 128)
    s = F.pad(W, (0, G * 128 - K)).reshape(E, N, G, 128).abs().amax(-1) / 448
    return (W / s.repeat_interleave(128, -1)[..., :K]).to(torch.float8_e4m3fn), s


@_per_expert
def int4_weight(W: torch.Tensor, group: int):
    """fp32 [E, N, K] -> (uint8 [E, N, ceil(K/2)] low nibble = even k, scale [E, N, ceil(K/group)])."""
    E, N, K = W.shape
    G = -(-K // group)
    s = F.pad(W, (0, G * group - K)).reshape(E, N, G, group).abs().amax(-1) / 7
    q = torch.round(W / s.repeat_interleave(group, -1)[..., :K]).clamp(-8, 7).to(torch.int16)
    q = F.pad(q, (0, (-K) % 2)) & 0x0F
    return (q[..., 0::2] | (q[..., 1::2] << 4)).to(torch.uint8), s


def make_inputs(case: Case, form: str, dtype: torch.dtype, device: str, seed: int | None = None) -> dict:
    seed = int(torch.randint(0, 2**31 - 1, ()).item()) if seed is None else seed
    hidden, logits, gate_up, down = moe_inputs(case.N, case.H, case.E, case.I, torch.float32, seed=seed,
                                               device=device)
    x = {"hidden": hidden.to(dtype), "router_logits": logits.to(dtype), "form": form}
    if form.startswith("fp8"):
        x["gate_up"], x["gate_up_scale"] = fp8_weight(gate_up, form == "fp8-block")
        x["down"], x["down_scale"] = fp8_weight(down, form == "fp8-block")
        if form == "fp8-static":
            gen = torch.Generator(device=device).manual_seed(seed)
            act_amax = 3.0  # |silu(g) * u| of these inputs stays below ~3
            x["gate_up_input_scale"] = hidden.abs().max() / 448 * (0.5 + torch.rand(case.E, generator=gen,
                                                                                      device=device))
            x["down_input_scale"] = torch.full((case.E,), act_amax / 448, device=device) * (
                0.5 + torch.rand(case.E, generator=gen, device=device))
    else:
        group = int(form.rpartition("g")[2])
        x["group_size"] = group
        x["gate_up"], x["gate_up_scale"] = int4_weight(gate_up, group)
        x["down"], x["down_scale"] = int4_weight(down, group)
        x["gate_up_scale"], x["down_scale"] = x["gate_up_scale"].to(dtype), x["down_scale"].to(dtype)
    return x


def args(x: dict, case: Case) -> tuple:
    """The op's positional arguments for x's form."""
    w = (x["hidden"], x["router_logits"], x["gate_up"], x["gate_up_scale"], x["down"], x["down_scale"])
    if x["form"].startswith("fp8"):
        return w + (x.get("gate_up_input_scale"), x.get("down_input_scale"), case.top_k, case.norm)
    return w + (case.top_k, case.norm, x["group_size"])


def oracle(case: Case, x: dict) -> torch.Tensor:
    """The fp32 reference (gdn_export.ops.moe_quant.naive) on the inputs' device (the GPU at real
    sizes: IEEE fp32 products, TF32 off), hidden in fp32; returned on the CPU."""
    from gdn_export.ops.moe_quant import naive as quant_naive

    ref = {n: (t.detach() if isinstance(t, torch.Tensor) else t) for n, t in x.items()}
    ref["hidden"] = ref["hidden"].float()
    ref["router_logits"] = ref["router_logits"].float()
    if not x["form"].startswith("fp8"):
        ref["gate_up_scale"], ref["down_scale"] = ref["gate_up_scale"].float(), ref["down_scale"].float()
    fn = quant_naive.moe_fp8 if x["form"].startswith("fp8") else quant_naive.moe_int4
    with fp32_products(ref["hidden"].device):
        return fn(*args(ref, case)).cpu()


def check(case: Case, x: dict, out: torch.Tensor, want: torch.Tensor) -> None:
    dtype = x["hidden"].dtype
    assert out.dtype == dtype and tuple(out.shape) == (case.N, case.H), (out.dtype, tuple(out.shape))
    err = rel_rms(out.detach().cpu().float(), want)
    static = x["form"] == "fp8-static"
    bound = BOUND[(static, dtype)]
    if static and dtype != torch.float32:
        # The 16-bit activation the kernel rounds to e4m3 can sit on the other side of a rounding
        # boundary than the fp32 reference's: that down input moves by one e4m3 step (2^-3 of its
        # binade), ~0.125 / sqrt(I) of its token's output; above 2e-2 for I < 40 (I = 4: one such
        # flip in 60 pairs failed 2e-2 on the H200).
        bound = max(bound, 0.125 / case.I ** 0.5)
    assert err <= bound, f"out: relative RMS {err:.3g} > {bound:g} ({x['form']}, {dtype})"
