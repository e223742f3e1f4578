"""Triton pieces shared by the quantized-linear kernels (triton_fp8.py, triton_int4.py, triton_gemv.py):
e4m3 rounding, the 16-bit / fp32 product, the grouped tile order, the split-K epilogue and its
arrival counters, and the launch heuristics.

The arithmetic is the contract's (gdn_export/ops/quant_linear/__init__.py): fp8 values are exact in
bf16 and int4 values exact in fp16 / bf16, so a product of such operands on the tensor cores with
fp32 accumulation is exact per term; the only rounding left is fp32 accumulation order.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from kernels.triton_utils import next_pow2

# Triton's CPU interpreter (3.9) casts fp32 -> float8e4nv rounding ties away from zero (1.0625 -> 1.125,
# where torch and the GPU's cvt.rn give 1.0) and returns garbage from 16-bit tl.dot: under it, fp8
# rounding is done on the bits and 16-bit operands are widened (values unchanged). On the GPU the
# hardware conversion (cvt.rn.satfinite.e4m3x2.f32) rounds to nearest even, as torch does.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
SOFT_FP8 = tl.constexpr(INTERPRET)
UPCAST = tl.constexpr(INTERPRET)

E4M3_MAX = 448.0
# Decode (skinny) path up to this many rows: weight-read bound, quantization of x fused per tile.
SKINNY_M = 32
# Skinny launch parameters: column tile, warps, pipeline stages, programs per multiprocessor that
# split K aims at (the sweep of docs/perf/quant_linear.md, H200 2026-12-03).
SKINNY = dict(BN=64, warps=4, stages=4, per_sm=2)
# gpu.py sends one-row x (M = 1) to the CUDA-core GEMV of gemv.py when set; off: no launch of it was
# under 0.8x bf16 on every shape (docs/perf/quant_linear.md, H200 2026-12-03).
GEMV = False


@triton.jit
def e4m3_round(q):
    """fp32 q in [-448, 448] rounded to the nearest e4m3 value (ties to even), still fp32: normals keep
    3 mantissa bits (drop 20 bits of fp32's 23 with round-half-even on the bits), subnormals
    (|q| < 2^-6) are multiples of 2^-9 (rounded through the 2^23 magic number)."""
    a = tl.abs(q)
    bits = a.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000
    normal = bits.to(tl.float32, bitcast=True)
    sub = ((a * 512.0 + 8388608.0) - 8388608.0) * 0.001953125
    r = tl.where(a < 0.015625, sub, normal)
    return tl.where(q < 0, -r, r)


@triton.jit
def div_exact(x, s, r):
    """x / s correctly rounded (IEEE division, as torch's), given r = 1 / s correctly rounded (one
    tl.math.div_rn per scale, outside the element loop): q = x * r is within one ulp, the remainder
    x - q * s is exact in an FMA, and q + remainder * r rounds to the correctly rounded quotient
    (Markstein's theorem). Where x * r leaves the fp32 range the first product is kept (far outside
    e4m3's +-448, which the caller clamps). Per element: two multiplies, two FMAs and a select, where
    tl.math.div_rn compiles to a reciprocal, a refinement and a slow-path call per element."""
    q = x * r
    rem = tl.fma(-q, s, x)
    q1 = tl.fma(rem, r, q)
    return tl.where(tl.abs(q) < 3.0e38, q1, q)


@triton.jit
def to_e4m3(q, SOFT: tl.constexpr):
    """fp32 q (already clamped to +-448) -> float8e4nv, round to nearest even."""
    if SOFT:
        q = e4m3_round(q)
    return q.to(tl.float8e4nv)


@triton.jit
def group_scale(b_x):
    """Per-row scale of a [R, 128] fp32 group tile (one 128-group of each row): max(amax, 1e-10) / 448
    (IEEE division), the fine-grained format's activation scale."""
    amax = tl.maximum(tl.max(tl.abs(b_x), axis=1), 1e-10)
    return tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))


@triton.jit
def clamped_quotient(x, s, r):
    """fp32 x / s correctly rounded (div_exact, r = 1 / s correctly rounded), clamped to e4m3's +-448."""
    return tl.minimum(tl.maximum(div_exact(x, s, r), -448.0), 448.0)


@triton.jit
def quantize_e4m3(x, s, r, SOFT: tl.constexpr):
    """e4m3(clamp(x / s)) of fp32 x, the contract's activation quantization. The quotient is the
    correctly rounded one, as the contract's x / s: x * (1 / s) differs from it in the last bit, which
    moves an element next to an e4m3 rounding tie to the other neighbour (16-bit x over a scale made
    from 16-bit values lands there often: 4 of 264 elements in one test row)."""
    return to_e4m3(clamped_quotient(x, s, r), SOFT)


@triton.jit
def quantize_activation(x, s, EXACT: tl.constexpr, SOFT: tl.constexpr):
    """fp32 x / s (s broadcastable, fp32) clamped to +-448 and rounded to e4m3; EXACT: the quotient
    correctly rounded (quantize_e4m3, one div_rn per scale), else x * (1 / s)."""
    if EXACT:
        return quantize_e4m3(x, s, tl.math.div_rn(s * 0.0 + 1.0, s), SOFT)
    return to_e4m3(tl.minimum(tl.maximum(x * (1.0 / s), -448.0), 448.0), SOFT)


@triton.jit
def exact_dot(a, b, UP: tl.constexpr):
    """a [BM, BK] @ b [BK, BN] -> fp32, for operands whose values are exact in a's dtype (bf16 / fp16
    holding fp8 or int4 values, or fp32 on IEEE)."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, input_precision="ieee")
    elif UP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def arrive_last(counter, tile, SPLIT):
    """After a program stored its split-K partial of `tile`: True in the last of the SPLIT programs to
    arrive (an acq_rel atomic count after a block barrier, so every partial is visible to it). That
    program sums the partials, stores y and calls `release(counter, tile)`."""
    tl.debug_barrier()
    return tl.atomic_add(counter + tile, 1, sem="acq_rel") == SPLIT - 1


@triton.jit
def release(counter, tile):
    """Leave `tile`'s arrival counter at 0 for the next launch."""
    tl.atomic_xchg(counter + tile, 0)


@triton.jit
def grouped_tile(i_mn, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of program i_mn in grouped order: GROUP_M row tiles take each column
    tile of W in turn while it sits in L2."""
    n_m, n_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    width = GROUP_M * n_n
    first_m = (i_mn // width) * GROUP_M
    rows = tl.minimum(n_m - first_m, GROUP_M)
    return first_m + (i_mn % width) % rows, (i_mn % width) // rows


@triton.jit
def finish_split(b_acc, part, counter, tile, i_s, SPLIT, size, o_y, mask, PARTIAL: tl.constexpr):
    """Split-K epilogue of one output tile, in the same launch. b_acc: this program's fp32 partial
    over its K range; o_y / mask: the tile's element offsets into y ([size] elements) and bounds.
    PARTIAL (SPLIT > 1): store the partial in part [SPLIT, size], count the arrival; the last of the
    SPLIT programs of `tile` sums every partial (in split order) and resets the counter.
    Returns (the tile's full fp32 sum, whether this program stores y: the last arrival, or always
    without PARTIAL)."""
    last = True
    if PARTIAL:
        tl.store(part + i_s * size + o_y, b_acc, mask=mask)
        last = arrive_last(counter, tile, SPLIT)
        if last:
            b_acc = tl.zeros(b_acc.shape, dtype=tl.float32)
            for j in range(SPLIT):
                b_acc += tl.load(part + j * size + o_y, mask=mask, other=0.0, cache_modifier=".cg")
            release(counter, tile)
    return b_acc, last


_COUNTERS: dict = {}


def counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 arrival counters, one per output tile, kept per (device, n): every launch leaves them
    at 0 again, so they are allocated once (on the first, uncaptured call) and reused by later launches
    and CUDA-graph replays of one stream."""
    key = (device, n)
    c = _COUNTERS.get(key)
    if c is None:
        c = _COUNTERS[key] = torch.zeros(n, dtype=torch.int32, device=device)
    return c


def empty(*shape, dtype, device) -> torch.Tensor:
    """Every buffer the launchers allocate (outputs, quantized x, split-K partials); the tests replace it
    with a NaN-filled allocation so that an element no kernel writes fails loudly."""
    return torch.empty(*shape, dtype=dtype, device=device)


@functools.lru_cache(maxsize=None)
def sm_count(index: int) -> int:
    """Multiprocessors of CUDA device `index` (132 on the H200); 1 for CPU tensors (interpreter)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def device_sms(t: torch.Tensor) -> int:
    return sm_count(t.device.index if t.device.index is not None else torch.cuda.current_device()) \
        if t.is_cuda else 4


def split_k(tiles_mn: int, k_tiles: int, sms: int) -> int:
    """Split-K factor for the skinny (decode) launches: about two programs per multiprocessor streaming
    weights, never more splits than K tiles. A function of shapes only (CUDA-graph safe)."""
    return max(1, min(k_tiles, round(SKINNY["per_sm"] * sms / max(tiles_mn, 1))))


def skinny_block_m(M: int) -> int:
    """Row block of the skinny launches: 16 (the smallest tl.dot) up to 32."""
    return max(16, next_pow2(M))
