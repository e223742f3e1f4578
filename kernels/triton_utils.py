"""Helpers shared by the Triton kernels of every op (kernels/<op>/triton/): dtype policy, varlen chunk tables, the
shared-memory fallback of the chunked prefill's launches."""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

# Every chunked kernel works on chunks of this many tokens; the WY solve is written for 4 x 16.
CHUNK = 64
SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)
# Storage dtypes of the recurrent state (math is fp32 whatever the storage).
STATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for the launchers' grids: plain Python, as next_pow2 (triton.cdiv is a constexpr
    function, ~5 us a host call)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1). Plain Python: triton.next_power_of_2 goes through
    Triton's constexpr-function wrapper, ~5 us a call, twice per decode launch."""
    return 1 << (max(int(n), 1) - 1).bit_length()


def launch_fitting(launch, value: int, floor: int, smaller, Dk: int, Dv: int, dtype: torch.dtype) -> int:
    """launch(value), retried with smaller(value) while Triton says the configuration outgrows the
    GPU's shared memory (OutOfResources, matched by name); below `floor`, a one-line ValueError that
    names the shapes. Returns the value that launched (callers remember it per configuration)."""
    while True:
        try:
            launch(value)
            return value
        except Exception as exc:
            if type(exc).__name__ != "OutOfResources":
                raise
            if value <= floor:
                raise ValueError(f"gated delta rule prefill: Dk={Dk}, Dv={Dv} in {str(dtype)[6:]} needs more "
                                 f"shared memory than this GPU has ({str(exc).splitlines()[0][:120]}); use "
                                 f"bf16 / fp16 inputs or the cuda backend") from None
            value = smaller(value)


def gdn_outputs(x: torch.Tensor, B: int, T: int, Hv: int, Dk: int, Dv: int, N: int, h0, out, final_state):
    """The gated delta rule launchers' outputs: o [B, T, Hv, Dv] in x's dtype and final_state [N, Hv, Dk,
    Dv] in h0's dtype (fp32 without h0), or the `out` / `final_state` given."""
    o = out if out is not None else x.new_empty(B, T, Hv, Dv)
    ht = final_state if final_state is not None else torch.empty(
        N, Hv, Dk, Dv, dtype=torch.float32 if h0 is None else h0.dtype, device=x.device)
    return o, ht


def raw_operands(dtype: torch.dtype, Dk: int, Dv: int) -> bool:
    """Whether the chunked kernels feed the stored 16-bit q, k, v, w to the tensor cores as they are
    (fp32 factors met as hi + lo halves) instead of fp32 copies on TF32.

    Only for head dims that are multiples of 64, the shapes the H200 test grid verified: with
    Dv = 16 or 24 Triton 3.6 computed u wrong and a 32-column state block past Dv = 16 faulted
    (H200, Triton 3.6). Other dims take the fp32-operand path (slower, same math)."""
    return dtype != torch.float32 and Dk % 64 == 0 and Dv % 64 == 0


def compute_dtype(v: torch.Tensor) -> torch.dtype:
    """The dtype the kernels read and write: v's, except float64 which runs in fp32."""
    return torch.float32 if v.dtype == torch.float64 else v.dtype


@triton.jit
def to_state_dtype(x, dtype: tl.constexpr):
    """fp32 x rounded to the state's storage dtype, round-to-nearest-even as torch and CUDA do.

    bf16 is rounded by hand on the bits (then the cast is exact): Triton's interpreter truncates
    fp32 -> bf16 whatever fp_downcast_rounding says, so the CPU tests would otherwise test a
    different rounding than the GPU's. NaN and inf keep their class; a few integer ops per
    element cost nothing in these memory-bound stores."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


def state_dtype(initial_state: torch.Tensor) -> torch.dtype:
    """The storage dtype the kernels read and write the state in: initial_state's (float64 -> fp32)."""
    if initial_state.dtype == torch.float64:
        return torch.float32
    if initial_state.dtype not in STATE_DTYPES:
        raise ValueError(f"initial_state must be float32, float16 or bfloat16, got {initial_state.dtype}")
    return initial_state.dtype


def as_kernel_input(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x contiguous in `dtype` (the usual case returns x itself without a torch call)."""
    if x.dtype == dtype and x.is_contiguous():
        return x
    return x.to(dtype).contiguous()


def token_stride(x: torch.Tensor) -> int | None:
    """Elements between consecutive tokens of x [B, T, ...] (the batch axis flattened into the
    token axis: token b * T + t) when its inner dims are packed, else None.

    q / k / v of a GatedDeltaNet layer are channel slices of the conv's output [B, T, C] (and the
    conv's input one of the fused projection's): packed within a token, a stride of C between
    tokens. The kernels take that stride instead of a contiguous copy (four copies a layer)."""
    B, T = x.shape[:2]
    inner = x.shape[2:].numel()
    if x.is_contiguous():  # the common case, without the walk over strides below (host time a decode pays)
        return inner
    expected = 1
    for size, stride in zip(reversed(x.shape[2:]), reversed(x.stride()[2:])):
        if size != 1 and stride != expected:
            return None
        expected *= size
    if B * T == 1:
        return inner
    if T == 1:
        stride = x.stride(0)
    else:
        stride = x.stride(1)
        if B > 1 and x.stride(0) != T * stride:
            return None
    return stride if stride >= inner else None


def token_strides(*xs: torch.Tensor) -> tuple[int, ...]:
    """`token_stride` of each launcher input (prepared by `prepare_inputs`); a one-line error for
    one without (the kernels would read the wrong elements)."""
    strides = tuple(token_stride(x) for x in xs)
    if None in strides:
        bad = xs[strides.index(None)]
        raise ValueError(f"triton kernels: a [B, T, H, D] input needs heads packed within a token and a fixed "
                         f"token stride (prepare_inputs makes one), got shape {tuple(bad.shape)} strides {bad.stride()}")
    return strides


def as_token_input(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in `dtype` with a token stride (`token_stride`): x itself when it has one, else a
    contiguous copy."""
    if x.dtype == dtype and token_stride(x) is not None:
        return x
    return x.to(dtype).contiguous()


def check_head_dims(Dk: int, Dv: int) -> None:
    if Dk > 256 or Dv > 256:
        raise ValueError(f"the triton kernels support head dims up to 256, got Dk={Dk}, Dv={Dv}")


def chunk_indices(cu_seqlens: torch.Tensor, total: int, offsets: list[int] | None = None,
                  chunk: int = CHUNK) -> torch.Tensor:
    """[NT, 2] int32 (sequence, chunk within the sequence) for every chunk of a packed batch of
    `total` tokens, padded with (-1, 0) rows up to NT = total // chunk + N (no packing of N
    sequences has more chunks), so that the grid never depends on the lengths.

    offsets: cu_seqlens as already read on the host (check_cu_seqlens): the table is built there
    (vectorised) and copied over without waiting, one transfer, and kept beside the checked
    cu_seqlens for its later calls. Without them (during CUDA-graph capture) it is computed on the
    device from cu_seqlens: a dozen small launches, no synchronisation either."""
    n = cu_seqlens.numel() - 1
    size = total // chunk + n
    if offsets is not None:
        entry = _checked_entry(cu_seqlens)
        table = None if entry is None else entry.tables.get((chunk, total))
        if table is None:
            table = _host_chunk_table(offsets, size, chunk).to(cu_seqlens.device, non_blocking=True)
            if entry is not None:
                entry.tables[(chunk, total)] = table
        return table
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    n_chunks = (lens + chunk - 1) // chunk
    ends = torch.cumsum(n_chunks, 0)
    rows = torch.arange(size, device=cu_seqlens.device)
    seq = torch.searchsorted(ends, rows, right=True)
    valid = seq < n
    seq = seq.clamp(max=n - 1)
    local = rows - (ends - n_chunks)[seq]
    return torch.stack([torch.where(valid, seq, -1), torch.where(valid, local, 0)], 1).to(torch.int32).contiguous()


def _host_chunk_table(offsets: list[int], size: int, chunk: int) -> torch.Tensor:
    """chunk_indices' table on the host, from checked offsets, without a Python loop per chunk."""
    off = torch.tensor(offsets, dtype=torch.int64)
    n_chunks = (off[1:] - off[:-1] + chunk - 1) // chunk
    seq = torch.repeat_interleave(torch.arange(n_chunks.numel()), n_chunks)
    starts = torch.cumsum(n_chunks, 0) - n_chunks
    local = torch.arange(seq.numel()) - starts[seq]
    table = torch.empty(size, 2, dtype=torch.int32)
    table[:, 0] = -1
    table[:, 1] = 0
    table[: seq.numel(), 0] = seq
    table[: seq.numel(), 1] = local
    return table


@dataclass
class _Checked:
    """A cu_seqlens tensor already read and checked, at one version of its data."""
    source: weakref.ref
    version: int
    total: int
    cu: torch.Tensor  # int32, contiguous, on the source's device
    offsets: list[int]
    tables: dict = field(default_factory=dict)  # (chunk, total) -> chunk_indices table on the device


# The last few cu_seqlens read on the host, by id. A model passes one cu_seqlens to every layer of a
# forward: only the first layer's call reads it (a synchronisation); the others find it here. An
# entry holds only if it is the same live tensor at the same version (any in-place change through
# PyTorch bumps the version); writes behind PyTorch's back (raw pointers) are not seen, as with any
# cached tensor metadata (flash-linear-attention caches by identity alone).
_CHECKED: OrderedDict[int, _Checked] = OrderedDict()
_CHECKED_MAX = 16


def _checked_entry(cu: torch.Tensor) -> _Checked | None:
    for entry in list(_CHECKED.values()):  # a snapshot: another thread may be adding an entry
        if entry.cu is cu:
            return entry
    return None


def check_cu_seqlens(cu_seqlens: torch.Tensor, total: int) -> tuple[torch.Tensor, list[int] | None]:
    """cu_seqlens as int32 on its device, and its values on the host, checked to rise from 0 to the
    packed length: one read (a synchronisation on a GPU) per tensor and version of its data (later
    calls with the same unchanged tensor reuse it), which CUDA-graph capture forbids: there the
    check is skipped and the offsets are None."""
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be [N + 1] with N >= 1, got {tuple(cu_seqlens.shape)}")
    if cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing():
        return cu_seqlens.to(torch.int32).contiguous(), None
    key, version = id(cu_seqlens), _version(cu_seqlens)
    hit = _CHECKED.get(key)
    if hit is not None and version is not None and hit.source() is cu_seqlens and hit.version == version \
            and hit.total == total:
        _CHECKED.move_to_end(key)
        return hit.cu, hit.offsets
    offsets = cu_seqlens.tolist()
    if offsets[0] != 0 or offsets[-1] != total:
        raise ValueError(f"cu_seqlens must run from 0 to T={total}, got {offsets[0]}..{offsets[-1]}")
    if any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"cu_seqlens must not decrease, got {offsets[:8]}{'...' if len(offsets) > 8 else ''}")
    cu = cu_seqlens.to(torch.int32).contiguous()
    if version is not None:
        _CHECKED[key] = _Checked(weakref.ref(cu_seqlens), version, total, cu, offsets)
        _CHECKED.move_to_end(key)
        while len(_CHECKED) > _CHECKED_MAX:
            _CHECKED.popitem(last=False)
    return cu, offsets


def _version(t: torch.Tensor) -> int | None:
    """The tensor's data version, or None where it keeps none (inference-mode tensors: never cached)."""
    try:
        return t._version
    except RuntimeError:
        return None


def prepare_inputs(q, k, v, g, beta, gates, scale, cu_seqlens):
    """The checks and casts every gated-delta-rule launcher starts with.

    Returns (q, k, v, g, beta, gates, scale, cu, offsets): q, k, v in the compute dtype with a token
    stride (`as_token_input`: channel slices of a wider tensor are not copied), g
    fp32 and beta in the compute dtype (unless `gates` carries the raw (a, b, A_log, dt_bias)
    instead), scale resolved to Dk ** -0.5 by default, cu_seqlens checked as int32 (or None) and
    its values on the host (check_cu_seqlens; None without cu_seqlens or during graph capture).
    """
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    check_head_dims(Dk, Dv)
    if Hv % Hk:
        raise ValueError(f"value heads ({Hv}) must be a multiple of key heads ({Hk})")
    scale = Dk ** -0.5 if scale is None else float(scale)
    dtype = compute_dtype(v)
    q, k, v = (as_token_input(x, dtype) for x in (q, k, v))
    if gates is None:
        g, beta = as_kernel_input(g, torch.float32), as_kernel_input(beta, dtype)
    else:
        gates = tuple(x.contiguous() for x in gates)
    cu = offsets = None
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"cu_seqlens needs B = 1, got B={B}")
        cu, offsets = check_cu_seqlens(cu_seqlens, T)
    return q, k, v, g, beta, gates, scale, cu, offsets


# Triton's CPU interpreter (3.9) returns garbage from bf16 x bf16 tl.dot: there, 16-bit operands
# are widened first (their values are unchanged, so the result is what the GPU computes).
UPCAST_DOT = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def exp_libm(x):
    """fp32 exp(x) as CUDA's expf computes it (libdevice's __nv_expf, what PyTorch's CUDA kernels call),
    so a kernel can match PyTorch bit for bit; tl.exp is ex2.approx on a scaled argument, a few ulp off.
    numpy's exp under Triton's interpreter (which has no libdevice)."""
    if INTERPRETED:
        return tl.exp(x)
    else:
        return libdevice.exp(x)


@triton.jit
def dot(a, b, IEEE: tl.constexpr):
    # fp32 inputs must stay exact (the 2e-3 bound); half inputs take TF32 / bf16 tensor cores.
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    elif UPCAST_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32")
    else:
        return tl.dot(a, b, input_precision="tf32")


# PTX of int4_nibbles' register path, 4 bytes an instance: prmt spreads bytes (b0, b1) and (b2, b3)
# into the low bytes of two 16-bit lanes; lop3 (a & 0x000F000F) ^ MAGIC (immLut 0x6A) keeps a nibble
# per lane, flips its sign bit (two's complement -> offset 8) and ORs in the exponent of 2^7 (bf16)
# or 2^10 (fp16), whose mantissa unit is 1: the lane reads 128 + (q + 8) (bf16) or 1024 + (q + 8)
# (fp16); one packed FMA subtracts 136 / 1032 (exact). 14 instructions for 8 values, no I2F.
_NIBBLE_ASM = """{
.reg .b32 t0, t1, s0, s1, one, off;
mov.b32 one, ONE;
mov.b32 off, OFF;
prmt.b32 t0, $4, 0, 0x4140;
prmt.b32 t1, $4, 0, 0x4342;
shr.b32 s0, t0, 4;
shr.b32 s1, t1, 4;
lop3.b32 t0, t0, 0x000F000F, MAGIC, 0x6A;
lop3.b32 t1, t1, 0x000F000F, MAGIC, 0x6A;
lop3.b32 s0, s0, 0x000F000F, MAGIC, 0x6A;
lop3.b32 s1, s1, 0x000F000F, MAGIC, 0x6A;
fma.rn.TY $0, t0, one, off;
fma.rn.TY $1, t1, one, off;
fma.rn.TY $2, s0, one, off;
fma.rn.TY $3, s1, one, off;
}"""
# The same on 2 bytes an instance (a 16-bit operand): one prmt, one shift, two lop3 and two packed
# FMAs give (lo(b0), lo(b1)) and (hi(b0), hi(b1)). Where the nibbles feed tl.dot as its register
# operand (the INT4 skinny GEMM's even / odd dots), a thread holds byte pairs of its fragment, and the
# 4-byte form made Triton assemble words from 16-bit shared-memory loads and take the results apart
# again: 86 PRMT and 421 instructions a [64, 128] K tile of the skinny GEMM's sm_90 code (Triton 3.6),
# 30 and 365 with this form.
_NIBBLE_ASM2 = """{
.reg .b32 w, t0, s0, one, off;
mov.b32 one, ONE;
mov.b32 off, OFF;
cvt.u32.u16 w, $2;
prmt.b32 t0, w, 0, 0x4140;
shr.b32 s0, t0, 4;
lop3.b32 t0, t0, 0x000F000F, MAGIC, 0x6A;
lop3.b32 s0, s0, 0x000F000F, MAGIC, 0x6A;
fma.rn.TY $0, t0, one, off;
fma.rn.TY $1, s0, one, off;
}"""
# The launchers' PTX argument of int4_nibbles (the INT4 skinny GEMM, int4_dequant, the quantized
# MoE experts): 0 the shift-and-convert path, 1 the PTX on 4 bytes an instance, 2 on 2 bytes an
# instance (the INT4 skinny GEMM's default, `nibbles` in skinny.CFG: 9.75 against 10.32 us for the
# 1.66B's mlp_down at M = 1 on the H100; the other launchers keep 1, untimed with 2).
# benchmarks/quant_linear_bench.py times them.
NIBBLE_PTX = 1


def _nibble_asm(asm: str, dtype: str) -> tl.constexpr:
    if dtype == "bf16":
        return tl.constexpr(asm.replace("MAGIC", "0x43084308").replace("ONE", "0x3F803F80").replace("OFF", "0xC308C308")
                            .replace("TY", "bf16x2"))
    return tl.constexpr(asm.replace("MAGIC", "0x64086408").replace("ONE", "0x3C003C00").replace("OFF", "0xE408E408")
                        .replace("TY", "f16x2"))


NIBBLE_ASM_BF16, NIBBLE_ASM_FP16 = _nibble_asm(_NIBBLE_ASM, "bf16"), _nibble_asm(_NIBBLE_ASM, "fp16")
NIBBLE_ASM2_BF16, NIBBLE_ASM2_FP16 = _nibble_asm(_NIBBLE_ASM2, "bf16"), _nibble_asm(_NIBBLE_ASM2, "fp16")


@triton.jit
def int4_nibbles(b_q, dt: tl.constexpr, UP: tl.constexpr, PTX: tl.constexpr):
    """uint8 bytes [..., H] -> (lo, hi) [..., H] in dt: the two's-complement int4 values of each byte's
    low and high nibble (exact in fp16 / bf16 / fp32). With PTX 1 or 2 (the launchers pass NIBBLE_PTX)
    on the GPU with a 16-bit dt, magic-number arithmetic in registers on 4 or 2 bytes an instance
    (_NIBBLE_ASM, _NIBBLE_ASM2); otherwise (fp32, the interpreter, PTX 0) sign-extending shifts and an
    int8 -> fp32 conversion."""
    if UP or dt == tl.float32 or PTX == 0:
        lo = ((b_q << 4).to(tl.int8, bitcast=True) >> 4).to(tl.float32).to(dt)
        hi = (b_q.to(tl.int8, bitcast=True) >> 4).to(tl.float32).to(dt)
    elif PTX == 2 and dt == tl.bfloat16:
        lo, hi = tl.inline_asm_elementwise(NIBBLE_ASM2_BF16, "=r,=r,h", [b_q], dtype=(tl.bfloat16, tl.bfloat16),
                                           is_pure=True, pack=2)
    elif PTX == 2:
        lo, hi = tl.inline_asm_elementwise(NIBBLE_ASM2_FP16, "=r,=r,h", [b_q], dtype=(tl.float16, tl.float16),
                                           is_pure=True, pack=2)
    elif dt == tl.bfloat16:
        lo, hi = tl.inline_asm_elementwise(NIBBLE_ASM_BF16, "=r,=r,=r,=r,r", [b_q], dtype=(tl.bfloat16, tl.bfloat16),
                                           is_pure=True, pack=4)
    else:
        lo, hi = tl.inline_asm_elementwise(NIBBLE_ASM_FP16, "=r,=r,=r,=r,r", [b_q], dtype=(tl.float16, tl.float16),
                                           is_pure=True, pack=4)
    return lo, hi


# Programmatic dependent launch (Hopper and later): a kernel launched with it may start while the kernel
# before it in the stream still runs, once every program of that kernel has signalled
# (gdc_launch_dependents), and its programs wait for that kernel's completion and memory (gdc_wait) before
# reading what it wrote or writing anything. A decode step is a chain of short kernels; with PDL each one's
# launch, and the skinny GEMM's weight prefetch into L2, overlap the kernel before it. CUDA graphs keep the
# dependency (programmatic edges). GDN_EXPORT_PDL=1 turns it on (off by default until timed on a GPU:
# benchmarks/quant_gpu.sh's "-pdl" runs); never under Triton's interpreter, on GPUs before sm_90 or on
# Triton builds without `launch_pdl`.
def pdl_from_env(environ=os.environ) -> bool:
    return environ.get("GDN_EXPORT_PDL", "0") == "1"


PDL = pdl_from_env()
_PDL_DEVICES: dict = {}


def pdl(t: torch.Tensor) -> bool:
    """Whether the kernels launched for tensor t take programmatic dependent launch (see PDL above). Their
    launchers pass USE_PDL=pdl(t) and launch_pdl=pdl(t) together (`pdl_launch`)."""
    if not PDL or not t.is_cuda:
        return False
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    ok = _PDL_DEVICES.get(index)
    if ok is None:
        ok = _PDL_DEVICES[index] = (os.environ.get("TRITON_INTERPRET", "0") != "1" and _triton_has_pdl()
                                    and torch.cuda.get_device_capability(index)[0] >= 9)
    return ok


def _triton_has_pdl() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {}) and hasattr(tl.extra.cuda, "gdc_wait")


def pdl_launch(t: torch.Tensor) -> dict:
    """The launch keywords of a kernel with a USE_PDL constexpr (`pdl_enter` first in its body)."""
    use = pdl(t)
    return {"USE_PDL": use, "launch_pdl": True} if use else {"USE_PDL": False}


@triton.jit
def pdl_enter(USE_PDL: tl.constexpr):
    """First in a kernel launched with PDL: wait for the kernel before this one (its completion and its
    memory), then let the next kernel launch (it waits here in turn, so at most two kernels of a chain
    are resident). Nothing may be read from or written to activations before it; a weight prefetch may
    come before it (`prefetch_l2`)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs):
    """prefetch.global.L2 of the 128-byte lines at `ptrs` (valid addresses: callers point masked lanes
    at one they own): nothing read into registers, nothing ordered; a hint the memory system may drop."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n mov.u32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)
