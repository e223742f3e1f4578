"""Independent fp64 references of the quantized-linear contract (gdn_export/ops/quant_linear) and input
makers shared by the Triton (CPU interpreter) and GPU tests of gdn_export/ops/quant_linear/gpu.py.

Written from the contract's text alone, not from naive.py: dequantize, fake-quantize activations with
torch's float8_e4m3fn cast (round to nearest even), products in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

E4M3_MAX = 448.0


def e4m3(t: torch.Tensor) -> torch.Tensor:
    """fp32 t clamped to +-448 and rounded to e4m3 (nearest even), back in fp32."""
    return t.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()


def ref_fp8_linear(x, weight, weight_scale, input_scale, bias=None):
    xq = e4m3(x.float() / input_scale.float())
    y = (xq.double() @ weight.double().t()) * (input_scale.float() * weight_scale.float()).double()
    if bias is not None:
        y = y + bias.double()
    return y


def ref_fp8_block_linear(x, weight, weight_scale_inv, bias=None):
    K = x.shape[-1]
    N = weight.shape[0]
    G = math.ceil(K / 128)
    xf = torch.nn.functional.pad(x.float().reshape(-1, K), (0, G * 128 - K)).view(-1, G, 128)
    s = xf.abs().amax(-1).clamp_min(1e-10) / E4M3_MAX  # fp32, IEEE division
    xq = e4m3(xf / s[..., None])
    xd = (xq.double() * s[..., None].double()).reshape(-1, G * 128)[:, :K]
    wsi = weight_scale_inv.float().double()
    w = weight.double() * wsi.repeat_interleave(128, 0)[:N].repeat_interleave(128, 1)[:, :K]
    y = xd @ w.t()
    if bias is not None:
        y = y + bias.double()
    return y.reshape(*x.shape[:-1], N)


def unpack_int4(qweight: torch.Tensor, K: int) -> torch.Tensor:
    """qweight [N, ceil(K/2)] uint8 -> int4 values [N, K] int64 (low nibble even k, two's complement)."""
    b = qweight.long()
    lo, hi = b % 16, b // 16
    q = torch.stack((lo, hi), dim=-1).reshape(b.shape[0], -1)[:, :K]
    return torch.where(q >= 8, q - 16, q)


def ref_int4_linear(x, qweight, scales, bias=None, group_size=128, pre_scale=None):
    """pre_scale [K] or None: x * pre_scale rounded to x's dtype first (the contract's AWQ step; the
    product of two 16-bit values is exact in fp64 and rounds once)."""
    K = x.shape[-1]
    if pre_scale is not None:
        x = (x.double() * pre_scale.double()).to(x.dtype)
    w = unpack_int4(qweight, K).double() * scales.double().repeat_interleave(group_size, 1)[:, :K]
    y = x.double() @ w.t()
    if bias is not None:
        y = y + bias.double()
    return y


# ---------------------------------------------------------------- inputs

def activations(M, K, dtype, kind, gen, device="cpu"):
    """x [M, K]: 'random' standard normal, or 'model' (heavy tails and a few outlier channels x30,
    as hidden states after RMSNorm look)."""
    x = torch.randn(M, K, generator=gen)
    if kind == "model":
        x = x * torch.exp(0.6 * torch.randn(M, K, generator=gen))
        idx = torch.randperm(K, generator=gen)[: max(1, K // 64)]
        x[:, idx] *= 30.0
    return x.to(device=device, dtype=dtype)


def fp8_weights(N, K, gen, device="cpu"):
    """weight [N, K] float8_e4m3fn and per-channel weight_scale [N] fp32 (absmax calibration)."""
    w = torch.randn(N, K, generator=gen) * 0.02 * torch.exp(0.3 * torch.randn(N, 1, generator=gen))
    ws = w.abs().amax(1).clamp_min(1e-8) / E4M3_MAX
    q = (w / ws[:, None]).to(torch.float8_e4m3fn)
    return q.to(device), ws.to(device)


def block_weights(N, K, gen, device="cpu"):
    """weight [N, K] float8_e4m3fn and weight_scale_inv [ceil(N/128), ceil(K/128)] fp32."""
    q = (torch.randn(N, K, generator=gen) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    wsi = (torch.rand(math.ceil(N / 128), math.ceil(K / 128), generator=gen) + 0.1) * 1e-4
    return q.to(device), wsi.to(device)


def int4_weights(N, K, group_size, dtype, gen, device="cpu"):
    """qweight [N, ceil(K/2)] uint8 (random nibbles, padding nibble random too) and scales
    [N, ceil(K/group_size)] in dtype (fp32 for fp32 x)."""
    qw = torch.randint(0, 256, (N, math.ceil(K / 2)), generator=gen, dtype=torch.int64).to(torch.uint8)
    sc = (torch.rand(N, math.ceil(K / group_size), generator=gen) + 0.2) * 0.01
    return qw.to(device), sc.to(device=device, dtype=dtype)


def input_scale_for(x, clip=0.6):
    """Static per-tensor activation scale as calibration gives it (clip < 1 clamps the outliers)."""
    return (x.float().abs().amax() * clip / E4M3_MAX).reshape(())


def rel_rms(actual, expected) -> float:
    a, e = actual.double(), expected.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - e).norm() / e.norm().clamp_min(1e-30)).item()


# Contract tolerances (relative RMS against the fp32 reference of the same quantized op).
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def nan_empty(*shape, dtype, device):
    """NaN-filled stand-in for triton_common.empty (ints: all ones)."""
    t = torch.empty(*shape, dtype=dtype, device=device)
    if dtype.is_floating_point:
        if dtype == torch.float8_e4m3fn:
            t.view(torch.uint8).fill_(0x7F)
        else:
            t.fill_(float("nan"))
    else:
        t.fill_(-1)
    return t


def pre_scales(K, dtype, gen):
    """An AWQ pre_quant_scale [K] in dtype: positive, spread over 0.25..4."""
    return torch.exp2(torch.rand(K, generator=gen) * 4 - 2).to(dtype)


# ---------------------------------------------------------------- the contract suite's cases

@dataclass(frozen=True)
class Case:
    """One quantized linear y [M, N] = x [M, K] @ W^T (+ bias) in format `form`: "fp8" (per-channel
    weight scale, static per-tensor input scale), "fp8-block" (128 x 128 weight blocks, x quantized per
    128-group of each row), "int4" (group `group` along K). `kind`: "random" or "model" activations."""

    name: str
    M: int
    K: int
    N: int
    form: str
    group: int = 128
    bias: bool = False
    kind: str = "random"

    @property
    def cost(self) -> int:
        return self.M * self.K * self.N


def _cases():
    shapes = [(1, 200, 63), (3, 384, 130), (65, 264, 130), (1, 136, 1), (40, 131, 63)]
    out = []
    for n, (M, K, N) in enumerate(shapes):
        for form, group in (("fp8", 128), ("fp8-block", 128), ("int4", 128), ("int4", 32)):
            fid = form if form != "int4" else f"int4-g{group}"
            kind = ("random", "model")[n % 2]
            out.append(Case(f"{fid}-M{M}-K{K}-N{N}-{kind}", M, K, N, form, group, bias=False, kind=kind))
        out.append(Case(f"fp8-M{M}-K{K}-N{N}-bias", M, K, N, "fp8", bias=True, kind="model"))
    return out


CASES = _cases()


def make_inputs(case: Case, dtype, device, seed: int = 0) -> dict:
    """Fresh inputs of `case` in `dtype` on `device` (weights and scales as the formats store them)."""
    gen = torch.Generator().manual_seed(seed * 1000 + case.M * 7 + case.K + case.N)
    x = activations(case.M, case.K, dtype, case.kind, gen)
    out = {"x": x, "seed": seed, "bias": torch.randn(case.N, generator=gen).to(dtype) if case.bias else None}
    if case.form == "fp8":
        out["weight"], out["weight_scale"] = fp8_weights(case.N, case.K, gen)
        out["input_scale"] = input_scale_for(x)
    elif case.form == "fp8-block":
        out["weight"], out["weight_scale_inv"] = block_weights(case.N, case.K, gen)
    else:
        out["qweight"], out["scales"] = int4_weights(case.N, case.K, case.group, dtype, gen)
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in out.items()}


def oracle(case: Case, x: dict) -> torch.Tensor:
    """The float64 reference on the CPU (written from the contract, not from naive.py)."""
    cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in x.items()}
    if case.form == "fp8":
        return ref_fp8_linear(cpu["x"], cpu["weight"], cpu["weight_scale"], cpu["input_scale"], cpu["bias"])
    if case.form == "fp8-block":
        return ref_fp8_block_linear(cpu["x"], cpu["weight"], cpu["weight_scale_inv"], cpu["bias"])
    return ref_int4_linear(cpu["x"], cpu["qweight"], cpu["scales"], cpu["bias"], case.group)


def check(case: Case, dtype, y: torch.Tensor, want: torch.Tensor, tight: bool = False) -> None:
    """y's dtype, shape, finiteness, and relative RMS within TOL[dtype] (1e-6 for an fp32 reference
    path: only the summation order differs from float64)."""
    assert y.dtype == dtype and tuple(y.shape) == (case.M, case.N), f"{case.name}: {y.dtype} {tuple(y.shape)}"
    assert torch.isfinite(y).all(), f"{case.name}: non-finite output (unwritten or overflowed)"
    bound = 1e-6 if tight and dtype == torch.float32 else TOL[dtype]
    err = rel_rms(y.cpu(), want)
    assert err <= bound, f"{case.name}: relative RMS {err:.3g} > {bound:g} ({dtype})"


def every_byte_int4(dtype, K: int = 64):
    """(qweight [256, K/2] uint8 whose row n holds byte (n + 37 h) % 256 at column h, so every byte value
    sits at every column; scales [256, K/32] of ones in dtype; x [16, K] in dtype, row m the unit vector
    of column 4 m + m % 2 (even and odd k)). With group size 32, y [16, 256] = x @ W^T is exactly the
    int4 value at (n, 4 m + m % 2): one term, no rounding, the nibble conversion alone under test."""
    KH = K // 2
    qw = ((torch.arange(256)[:, None] + 37 * torch.arange(KH)[None, :]) % 256).to(torch.uint8)
    sc = torch.ones(256, K // 32, dtype=dtype)
    cols = torch.tensor([4 * m + m % 2 for m in range(16)])
    x = torch.zeros(16, K, dtype=dtype)
    x[torch.arange(16), cols] = 1
    return qw, sc, x, cols
