"""The gated attention's output gate in one kernel: heads back to token order and the sigmoid gate.

    o     [B, H, T, D]  fp32 / fp16 / bf16, unit stride along D, any other strides (the attention's
                        output, heads first)
    gate  [B, T, H, D]  o's dtype, unit stride along D, any other strides (the gate half of each
                        head of the q projection's output: a strided view)
    out   [B, T, H D]   o's dtype, contiguous:
          out[b, t, h D + d] = round(o[b, h, t, d] * round(sigmoid(gate[b, t, h, d]))),
          sigmoid as PyTorch's CUDA kernel computes it (1 / (1 + expf(-g)) in fp32, IEEE division)
          and each step rounded to o's dtype, as PyTorch's o.transpose(1, 2).reshape(B, T, H D) *
          torch.sigmoid(gate.reshape(B, T, H D)) rounds them (the exported graph's arithmetic)
    outq  [B, T, H D]   float8_e4m3fn, contiguous (FP8 output only): e4m3(clamp(out / input_scale,
                        +-448)) of the rounded out, the quotient correctly rounded: bit for bit the x pass
                        of the FP8 output projection over out (kernels/quant_linear quantize_tensor);
                        row_scale [B T] fp32 receives input_scale per token

One pass where PyTorch's form takes four kernels (the copies of o and of the gate into token order,
the sigmoid, the product) and writes and reads three [B, T, H D] intermediates. Compiled without
floating-point contraction, as kernels/silu_mul (1 + expf(-g) would fuse with expf's last multiply).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.quant_linear.triton.common import SOFT_FP8, quantize_activation
from kernels.triton_utils import cdiv, exp_libm, next_pow2, pdl_enter, pdl_launch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TILE = 4096  # elements a program holds
FP_FUSION = False  # triton's enable_fp_fusion launch option (module docstring)


@triton.jit
def output_gate_kernel(o, gate, out, H, T, D, stride_ob, stride_oh, stride_ot, stride_gb, stride_gt, stride_gh,
                       outq, s_in, row_scale, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr,
                       QUANT: tl.constexpr = False, SOFT: tl.constexpr = False):
    """QUANT: also outq = e4m3(clamp(out / s_in)) of the rounded out (s_in a one-element fp32 tensor) and
    row_scale [B T] = s_in (module docstring)."""
    pdl_enter(USE_PDL)
    i_t, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = (i_t * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    ok = (t < T)[:, None] & (d < D)[None, :]
    b64, h64 = i_b.to(tl.int64), i_h.to(tl.int64)
    b_o = tl.load(o + b64 * stride_ob + h64 * stride_oh + t[:, None] * stride_ot + d[None, :], mask=ok, other=0.0)
    b_g = tl.load(gate + b64 * stride_gb + t[:, None] * stride_gt + h64 * stride_gh + d[None, :], mask=ok,
                  other=0.0).to(tl.float32)
    dtype = out.dtype.element_ty
    sig = tl.math.div_rn(tl.full(b_g.shape, 1.0, tl.float32), 1.0 + exp_libm(-b_g)).to(dtype).to(tl.float32)
    y = (b_o.to(tl.float32) * sig).to(dtype)
    tl.store(out + ((b64 * T + t[:, None]) * H + h64) * D + d[None, :], y, mask=ok)
    if QUANT:
        scale = tl.load(s_in)
        tl.store(outq + ((b64 * T + t[:, None]) * H + h64) * D + d[None, :],
                 quantize_activation(y.to(tl.float32), scale, True, SOFT), mask=ok)
        if i_h == 0:
            tl.store(row_scale + b64 * T + t, tl.zeros([BLOCK_T], tl.float32) + scale, mask=t < T)


def launch_config(T: int, D: int) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_D, num_warps) for T tokens of D channels a head."""
    block_d = max(16, next_pow2(D))
    block_t = max(1, min(TILE // block_d, next_pow2(T)))
    return block_t, block_d, 4 if block_t * block_d >= 2048 else 1


def output_gate_heads(o: torch.Tensor, gate: torch.Tensor, out: torch.Tensor, outq: torch.Tensor | None = None,
                      input_scale: torch.Tensor | None = None, row_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Launch over o [B, H, T, D] and gate [B, T, H, D] (unit stride along D, both) into out [B, T, H D]
    contiguous; with input_scale (fp32, one element) also outq (float8_e4m3fn, out's shape, contiguous) and
    row_scale [B T, 1] fp32 (module docstring). Returns out. Callers check shapes and dtypes
    (gdn_export.ops.output_gate)."""
    B, H, T, D = o.shape
    if o.numel() == 0:
        return out
    block_t, block_d, num_warps = launch_config(T, D)
    output_gate_kernel[(cdiv(T, block_t), H, B)](
        o, gate, out, H, T, D, o.stride(0), o.stride(1), o.stride(2), gate.stride(0), gate.stride(1), gate.stride(2),
        out if outq is None else outq, out if input_scale is None else input_scale,
        out if row_scale is None else row_scale,
        BLOCK_T=block_t, BLOCK_D=block_d, QUANT=input_scale is not None, SOFT=SOFT_FP8, num_warps=num_warps,
        enable_fp_fusion=FP_FUSION, **pdl_launch(out))
    return out
