"""Compile the FP8 KV-cache, quantized-MoE, quantized-linear and eager glue Triton kernels for sm_90 without a GPU.

    python benchmarks/sm90_compile_check.py [--filter SUBSTRING]

Each kernel is compiled (triton.compile, target cuda sm_90) with the constexprs, num_warps / num_stages
and pointer dtypes its Python launcher passes (the glue kernels: RMSNorm, silu * up, GDN gating, the output gate and
rotary at the families' shapes; bf16 and fp16 activations; FP8 cache on / off; MoE
FP8 per-channel / block-128 / INT4, static FP8 activations on / off; quantized linears at M = 1, 32,
300). Pointers carry the 16-byte divisibility hint a real launch of aligned tensors gets; integer
arguments that the launcher passes as 1 (per-channel scale groups) are constexpr 1, as Triton
specialises them. Prints one line per configuration (OK, registers / spill stack from cuobjdump
-res-usage, or the error) and exits 1 if any failed. Costs no device time; to match the H200's
Triton (3.6), run it with that version first on sys.path (PYTHONPATH).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
TARGET = GPUTarget("cuda", 90, 64)
ACT = {"bf16": "*bf16", "fp16": "*fp16"}


# Integer arguments that are a GEMM's N / K (and K's packed or blocked forms): multiples of 16 at every
# model's shapes, so launches get the divisibility hint (a case's types may say otherwise)
ALIGNED = ("N", "K", "KH", "KB")


def compile_one(fn, types: dict, constexprs: dict, num_warps: int, num_stages: int):
    """(regs, stack, shared bytes) of fn compiled for sm_90. types: argument name -> Triton type for the
    pointers and float scalars, "i32/16" for an integer the launch passes as a multiple of 16 (the
    default for the names in ALIGNED); every other non-constexpr argument is i32. Pointers, strides and "i32/16" integers get the
    divisibility-by-16 hint, as Triton specialises them at launch (without it the skinny GEMM's weight
    loads are not pipelined); unit strides are passed in constexprs as 1 (Triton's specialisation of
    contiguous tensors)."""
    sig, attrs = {}, {}
    if "USE_PDL" in fn.arg_names:  # programmatic dependent launch (kernels.triton_utils.PDL): off unless a case sets it
        constexprs = {"USE_PDL": False, **constexprs}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        else:
            sig[name] = types.get(name, "i32/16" if name in ALIGNED else "i32")
            aligned = sig[name] == "i32/16"  # an integer the launch passes as a multiple of 16 (Triton specialises it)
            if aligned:
                sig[name] = "i32"
            if aligned or sig[name].startswith("*") or name.startswith(("stride", "s_")):
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=TARGET, options=dict(num_warps=num_warps, num_stages=num_stages))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name],
                             capture_output=True, text=True).stdout
    usage = next(line for line in res.splitlines() if "REG:" in line).split()
    regs, stack = (next(u for u in usage if u.startswith(p)).split(":")[1] for p in ("REG:", "STACK:"))
    return int(regs), int(stack), k.metadata.shared


def p(names: str, t: str) -> dict:
    return {n: t for n in names.split()}


def p1(names: str) -> dict:
    return {n: 1 for n in names.split()}


def attention_cases():
    from kernels.attention.triton import decode, prefill
    from kernels.attention.triton.kv_cache_write import kv_cache_write_kernel
    from kernels.triton_utils import next_pow2

    hkv = 2
    for act in ("bf16", "fp16"):
        for fp8 in (True, False):
            kv = "*fp8e4nv" if fp8 else ACT[act]
            for D in (64, 128, 256):
                # decode: G * S = 8 (GQA 8, S 1) and the widest tile `supports` admits
                for M in sorted({8, decode.max_rows(D)}):
                    block_m = max(decode.MIN_ROWS, next_pow2(M))
                    bn, nw, ns = decode._config(D, block_m)
                    types = dict(q=ACT[act], k=kv, v=kv, mask="*u8", **p("part_o part_lse", "*fp32"),
                                 **p("qk_scale k_scale v_scale", "fp32"))
                    c = dict(HKV=hkv, G=M, S=1, D=D, BLOCK_M=block_m, BLOCK_N=bn, KV_FP8=fp8,
                             **p1("stride_qd stride_kd stride_vd stride_ml"))
                    yield (f"decode.split {act} kv={'fp8' if fp8 else act} D={D} M={M} BM={block_m} BN={bn} "
                           f"w={nw} s={ns}", decode.attn_decode_split_kernel, types, c, nw, ns)
                # prefill: the H200's config (sm90=True) and the sm_8x one where it differs
                for sm90 in (True, False):
                    bm, bn, nw, ns = prefill.config(D, sm90)
                    if not sm90 and (bm, bn, nw, ns) == prefill.config(D, True):
                        continue
                    types = dict(q=ACT[act], k=kv, v=kv, mask="*u8", o=ACT[act], kv_range="*i32", kv_read="*u8",
                                 **p("qk_scale k_scale v_scale", "fp32"))
                    c = dict(G=8, D=D, BLOCK_D=max(16, next_pow2(D)), BLOCK_M=bm, BLOCK_N=bn, KV_FP8=fp8,
                             **p1("stride_qd stride_kd stride_vd stride_od stride_ml"))
                    yield (f"prefill {act} kv={'fp8' if fp8 else act} D={D} {bm}x{bn} w={nw} s={ns}"
                           f"{'' if sm90 else ' (sm8x cfg)'}", prefill.attn_prefill_kernel, types, c, nw, ns)
                # cache write: 16-bit update into an fp8 cache (QUANT) or its own dtype
                types = dict(kc=kv, vc=kv, k=ACT[act], v=ACT[act], widx="*i32", **p("k_scale v_scale", "fp32"))
                c = dict(BLOCK_D=next_pow2(D), QUANT=fp8, **p1("s_kc_d s_vc_d s_k_d s_v_d"))
                nw = 1 if D <= 128 else 2
                yield (f"kv_cache_write {act}->{'fp8' if fp8 else act} D={D} w={nw}", kv_cache_write_kernel,
                       types, c, nw, 3)
        for D in (64, 128, 256):
            block_d = min(D, 64)
            c = dict(HKV=hkv, G=8, S=1, D=D, BLOCK_SPLITS=32, BLOCK_D=block_d, stride_od=1)
            yield (f"decode.combine {act} D={D}", decode.attn_decode_combine_kernel,
                   dict(part_o="*fp32", part_lse="*fp32", o=ACT[act]), c, 2, 3)
    # an fp8 update written into an fp8 cache as is (no scales)
    for D in (64, 128, 256):
        yield (f"kv_cache_write fp8->fp8 D={D}", kv_cache_write_kernel,
               dict(kc="*fp8e4nv", vc="*fp8e4nv", k="*fp8e4nv", v="*fp8e4nv", widx="*i64",
                    **p("k_scale v_scale", "fp32")),
               dict(BLOCK_D=D, QUANT=False, **p1("s_kc_d s_vc_d s_k_d s_v_d")), 1 if D <= 128 else 2, 3)
    # the positional prefill (gdn::attention_at): every CONFIGS entry and the candidates
    # benchmarks/long_context.py times, causal and streaming
    from kernels.attention.triton import prefill_positions as pp

    candidates = {*pp.CONFIGS.values(), (128, 32, 8, 2), (64, 64, 4, 2), (64, 32, 4, 2)}
    for act in ("bf16", "fp16"):
        for D in (64, 128, 256):
            for bm, bn, nw, ns in sorted(candidates):
                if D <= 64 and (bm, bn, nw, ns) != pp.CONFIGS["d64"]:
                    continue
                for streaming, fp8 in ((False, False), (True, False), (False, True)):
                    kv = "*fp8e4nv" if fp8 else ACT[act]
                    types = dict(q=ACT[act], k=kv, v=kv, o=ACT[act], past="*i64", **p("qk_scale k_scale v_scale", "fp32"))
                    c = dict(G=8, D=D, BLOCK_D=max(16, next_pow2(D)), BLOCK_M=bm, BLOCK_N=bn, STREAMING=streaming,
                             KV_FP8=fp8, **p1("stride_qd stride_kd stride_vd stride_od"))
                    yield (f"prefill_positions {act} kv={'fp8' if fp8 else act} D={D} {bm}x{bn} w={nw} s={ns}"
                           f"{' streaming' if streaming else ''}", pp.attn_prefill_positions_kernel, types, c, nw, ns)
    yield ("kv_range", prefill.kv_range_kernel, dict(mask="*u8", kv_range="*i32", kv_read="*u8"),
           dict(BLOCK_M=64, BLOCK_L=prefill.RANGE_TILE // 64, stride_ml=1), prefill.RANGE_WARPS, 3)


def moe_cases():
    from kernels.moe_quant.triton.moe_quant import FP8, INT4, moe_q_down_kernel, moe_q_gate_up_kernel
    from kernels.moe.triton.moe import _tiles
    from kernels.triton_utils import next_pow2

    E, H, I, top_k = 128, 2048, 768, 8
    for act in ("bf16", "fp16", "fp32"):
        for pairs in (8, 4096):  # decode and prefill tiles
            t = _tiles(pairs, H, I)
            ieee = act == "fp32"
            forms = [("fp8 per-channel", FP8, True), ("fp8 block-128", FP8, False), ("int4 g128", INT4, False)]
            for form, quant, per_channel in forms:
                w = "*fp8e4nv" if quant == FP8 else "*u8"
                sc = "*fp32" if quant == FP8 else (ACT.get(act, "*fp32"))
                for static in ((False, True) if quant == FP8 else (False,)):
                    types = dict(x=ACT.get(act, "*fp32"), gate_up=w, scale=sc, in_scale="*fp32", rows="*i32",
                                 counts="*i32", act=ACT.get(act, "*fp32"))
                    c = dict(K=top_k, BE=next_pow2(E), BM=t["BM"], BN=t["BN1"], BK=t["BK1"], QUANT=quant,
                             STATIC=static, IEEE=ieee, IN_GROUP=True, PTX=True)
                    if per_channel:
                        c["G"] = 1
                    name = f"moe.gate_up {act} {form} static={int(static)} pairs={pairs}"
                    yield name, moe_q_gate_up_kernel, types, c, 4, t["stages"]
                types = dict(act=ACT.get(act, "*fp32"), down=w, scale=sc, weights="*fp32", rows="*i32",
                             counts="*i32", y=ACT.get(act, "*fp32"))
                c = dict(BE=next_pow2(E), BM=t["BM"], BN=t["BN2"], BK=t["BK2"], QUANT=quant, IEEE=ieee, IN_GROUP=True,
                         PTX=True)
                if per_channel:
                    c["G"] = 1
                yield f"moe.down {act} {form} pairs={pairs}", moe_q_down_kernel, types, c, 4, t["stages"]


def linear_cases():
    from kernels.quant_linear.triton import common
    from kernels.quant_linear.triton.fp8 import fp8_gemm_kernel, quant_group_kernel, quant_tensor_kernel
    from kernels.quant_linear.triton.gemv import CFG, FP8_BLOCK, FP8_TENSOR, INT4, gemv_kernel
    from kernels.quant_linear.triton import skinny
    from kernels.quant_linear.triton.int4 import DEQUANT, int4_dequant_kernel, int4_gemm_kernel, scale_columns_kernel, tile_k

    for act in ("bf16", "fp16", "fp32"):
        x = ACT.get(act, "*fp32")
        exact = act == "fp32"
        for M in (1, 32, 300):
            for blockwise in (False, True):
                # fp8_gemm's choice (the prefill Triton route; on the H200 16-bit prefill goes to _scaled_mm)
                if M <= common.SKINNY_M:
                    BM, BN, BK = common.skinny_block_m(M), common.SKINNY["BN"], 128
                    x_fp8 = dot_fp8 = False
                    nw, ns = common.SKINNY["warps"], common.SKINNY["stages"]
                    partials = (True, False)
                else:
                    x_fp8 = blockwise
                    dot_fp8 = blockwise and not exact
                    BM, BN, BK = (128, 128, 64) if dot_fp8 else (64, 128, 64)
                    nw, ns = 8, (4 if dot_fp8 else 2)
                    partials = (False,)
                for partial in partials:
                    for bias in (False, True):
                        types = dict(x="*fp8e4nv" if x_fp8 else x, xs="*fp32" if x_fp8 else x, w="*fp8e4nv",
                                     ws="*fp32", s_in="*fp32", bias=x, y=x, part="*fp32" if partial else x,
                                     counter="*i32" if partial else "*fp32")
                        c = dict(BLOCKWISE=blockwise, X_FP8=x_fp8, DOT_FP8=dot_fp8, EXACT=exact, SOFT=False,
                                 UP=False, PARTIAL=partial, HAS_BIAS=bias, BM=BM, BN=BN, BK=BK, GROUP_M=8,
                                 **({"M": 1} if M == 1 else {}))  # Triton specialises an integer 1
                        yield (f"fp8_gemm {act} M={M} {'block' if blockwise else 'tensor'} {BM}x{BN}x{BK} "
                               f"split={int(partial)} bias={int(bias)}", fp8_gemm_kernel, types, c, nw, ns)
            # int4 gemm (M > 32 16-bit goes to int4_dequant + cuBLAS; fp32 keeps the Triton GEMM)
            if M <= common.SKINNY_M or exact:
                BK = tile_k(128) if M <= common.SKINNY_M else tile_k(128, cap=64)
                if M <= common.SKINNY_M:
                    BM, BN, nw, ns, partials = common.skinny_block_m(M), common.SKINNY["BN"], \
                        common.SKINNY["warps"], common.SKINNY["stages"], (True, False)
                else:
                    BM, BN, nw, ns, partials = 64, 64, 8, 2, (False,)
                for partial in partials:
                    for bias in (False, True):
                        types = dict(x=x, qw="*u8", sc=x, bias=x, y=x, part="*fp32" if partial else x,
                                     counter="*i32" if partial else x)
                        c = dict(GS=128, UP=False, PARTIAL=partial, HAS_BIAS=bias, BM=BM, BN=BN, BK=BK, GROUP_M=8,
                                 **({"M": 1} if M == 1 else {}))
                        yield (f"int4_gemm {act} M={M} {BM}x{BN}x{BK} split={int(partial)} bias={int(bias)}",
                               int4_gemm_kernel, types, c, nw, ns)
            if M == 1:
                for fmt, fname in ((FP8_TENSOR, "fp8-tensor"), (FP8_BLOCK, "fp8-block"), (INT4, "int4")):
                    for partial in (True, False):
                        types = dict(x=x, w="*u8" if fmt == INT4 else "*fp8e4nv", ws=x if fmt == INT4 else "*fp32",
                                     s_in="*fp32", bias=x, y=x, part="*fp32" if partial else x,
                                     counter="*i32" if partial else "*fp32")
                        c = dict(FMT=fmt, GS=128, EXACT=exact, SOFT=False, PARTIAL=partial, HAS_BIAS=True,
                                 BN=CFG["BN"], BK=CFG["BK"])
                        if fmt == FP8_TENSOR:
                            c["G"] = 1
                        yield (f"gemv {act} {fname} split={int(partial)}", gemv_kernel, types, c, CFG["warps"],
                               CFG["stages"])
        yield (f"quant_tensor {act}", quant_tensor_kernel, dict(x=x, xq="*fp8e4nv", row_scale="*fp32", s_in="*fp32"),
               dict(EXACT=exact, SOFT=False, BM=4, BK=1024), 4, 3)
        yield (f"quant_group {act}", quant_group_kernel, dict(x=x, xq="*fp8e4nv", xs="*fp32"),
               dict(EXACT=exact, SOFT=False, G=16), 4, 3)
        if not exact:
            d = DEQUANT
            for packed in (True, False):
                yield (f"int4_dequant {act} {d['BN']}x{d['BH']}{' packed' if packed else ''}", int4_dequant_kernel,
                       dict(qw="*u8", sc=x, w=x), dict(GS=128, UP=False, PTX=True, PACKED=packed, BN=d["BN"], BH=d["BH"]),
                       d["warps"], 3)
            yield (f"scale_columns {act} 4x1024", scale_columns_kernel, dict(x=x, s=x, y=x), dict(BM=4, BK=1024), 4, 3)
        # the skinny GEMM (decode, M <= 64, every format) with its default launch parameters
        for fmt, fname in ((skinny.FP8_TENSOR, "fp8-tensor"), (skinny.FP8_BLOCK, "fp8-block"), (skinny.INT4, "int4")):
            cfg = skinny.CFG[fmt]
            for M in (1, 32, 64):
                for partial in (True, False):
                    for pre in ((False, True) if fmt == skinny.INT4 else (False,)):
                        BK = skinny.block_k(fmt, 2048, 128, cfg)
                        types = dict(x=x, w="*u8" if fmt == skinny.INT4 else "*fp8e4nv",
                                     ws=x if fmt == skinny.INT4 else "*fp32", s_in="*fp32", pre=x, bias=x, y=x,
                                     part="*fp32" if partial else x, counter="*i32" if partial else "*fp32")
                        c = dict(FMT=fmt, GS=128, SOFT=False, UP=False, DOT_FP8=cfg["dot_fp8"] and not exact, PTX=1,
                                 HAS_PRE=pre, PARTIAL=partial, HAS_BIAS=False, EVEN=True,
                                 ONE_ROW=M == 1 and fmt != skinny.INT4, BN=cfg["BN"], BM=max(16, M),
                                 BK=BK, **({"M": 1} if M == 1 else {}))
                        if fmt == skinny.FP8_TENSOR:
                            c["G"] = 1
                        yield (f"skinny {act} {fname} M={M} BN={cfg['BN']} BK={BK} split={int(partial)}"
                               f"{' pre' if pre else ''}", skinny.skinny_kernel, types, c, cfg["warps"],
                               cfg["stages"])
                        if fmt == skinny.INT4 and M == 1:  # the nibbles on 2 bytes an instance; ragged tiles
                            yield (f"skinny {act} {fname} M=1 BN={cfg['BN']} BK={BK} split={int(partial)}"
                                   f"{' pre' if pre else ''} nibbles2", skinny.skinny_kernel, types, {**c, "PTX": 2},
                                   cfg["warps"], cfg["stages"])
                            yield (f"skinny {act} {fname} M=1 BN={cfg['BN']} BK={BK} split={int(partial)}"
                                   f"{' pre' if pre else ''} masked", skinny.skinny_kernel, types, {**c, "EVEN": False},
                                   cfg["warps"], cfg["stages"])
                        if M == 1 and not pre:  # with PDL: the weight prefetch and the grid-dependency wait
                            yield (f"skinny {act} {fname} M=1 BN={cfg['BN']} BK={BK} split={int(partial)} pdl",
                                   skinny.skinny_kernel, types, {**c, "USE_PDL": True}, cfg["warps"], cfg["stages"])


def norm_cases():
    from kernels.rms_norm.triton.rms_norm import launch_config, rms_norm_kernel

    # the families' norms: decode and prefill rows of the hidden size, q / k heads, GDN value heads
    for act in ("bf16", "fp16"):
        for R, D, kind in ((1, 2048, "zero"), (4096, 2048, "zero"), (65536, 256, "zero"), (65536, 128, "gated"),
                           (1, 5120, "plain"), (4096, 16384, "plain"), (1, 2048, "zero+residual"),
                           (4096, 2048, "zero+residual"), (4096, 4096, "plain+residual")):
            block_r, block_d, nw = launch_config(R, D)
            types = dict(x=ACT[act], w=ACT[act], g=ACT[act], y=ACT[act], res=ACT[act], s=ACT[act], eps="fp32",
                         yq=ACT[act], s_in=ACT[act], row_scale=ACT[act])
            c = dict(BLOCK_R=block_r, BLOCK_D=block_d, ZERO_CENTERED=kind.startswith("zero"), GATED=kind == "gated",
                     RESIDUAL=kind.endswith("residual"), QUANT=False, SOFT=False)
            yield (f"rms_norm {act} {kind} R={R} D={D} {block_r}x{block_d} w={nw}", rms_norm_kernel, types, c, nw, 1)
            if R > 64 and kind != "plain":  # an FP8 projection's x pass fused in (prefill rows)
                yield (f"rms_norm {act} {kind} R={R} D={D} fp8 out", rms_norm_kernel,
                       {**types, "yq": "*fp8e4nv", "s_in": "*fp32", "row_scale": "*fp32"},
                       {**c, "QUANT": True, "SOFT": False}, nw, 1)
            if R == 1:
                yield (f"rms_norm {act} {kind} R=1 D={D} pdl", rms_norm_kernel, types, {**c, "USE_PDL": True}, nw, 1)
    from kernels.silu_mul.triton.silu_mul import launch_config as silu_config, silu_mul_kernel

    for act in ("bf16", "fp16"):
        for R, I in ((1, 6144), (4096, 6144), (8, 300)):
            block_r, block_c, nw = silu_config(R, I)
            for use_pdl in (False, True) if R == 1 else (False,):
                yield (f"silu_mul {act} R={R} I={I} {block_r}x{block_c} w={nw}{' pdl' if use_pdl else ''}", silu_mul_kernel,
                       dict(gate=ACT[act], up=ACT[act], out=ACT[act], s_in=ACT[act], row_scale=ACT[act]),
                       dict(BLOCK_R=block_r, BLOCK_C=block_c, USE_PDL=use_pdl, QUANT=False, SOFT=False), nw, 1)
            if R > 64:  # the FP8 down projection's x pass fused in (prefill rows)
                yield (f"silu_mul {act} R={R} I={I} fp8 out", silu_mul_kernel,
                       dict(gate=ACT[act], up=ACT[act], out="*fp8e4nv", s_in="*fp32", row_scale="*fp32"),
                       dict(BLOCK_R=block_r, BLOCK_C=block_c, USE_PDL=False, QUANT=True, SOFT=False), nw, 1)
    from kernels.gated_delta_rule.triton.gating import gdn_gating_kernel, launch_config as gating_config

    for act in ("bf16", "fp16"):
        for R, H in ((1, 16), (32, 32), (4096, 32), (300, 48)):
            block_r, block_h, nw = gating_config(R, H)
            types = dict(a=ACT[act], b=ACT[act], A_log="*fp32", dt_bias=ACT[act], real="*i1", g="*fp32",
                         beta=ACT[act], beta_scale="fp32")
            for use_pdl in (False, True) if R == 1 else (False,):
                yield (f"gdn_gating {act} R={R} Hv={H} {block_r}x{block_h} w={nw}{' pdl' if use_pdl else ''}",
                       gdn_gating_kernel, types, dict(BLOCK_R=block_r, BLOCK_H=block_h, USE_PDL=use_pdl), nw, 1)
    from kernels.output_gate.triton.output_gate import launch_config as gate_config, output_gate_kernel

    for act in ("bf16", "fp16"):
        for T, D in ((1, 256), (4096, 256)):
            block_t, block_d, nw = gate_config(T, D)
            for use_pdl in (False, True) if T == 1 else (False,):
                yield (f"output_gate {act} T={T} D={D} {block_t}x{block_d} w={nw}{' pdl' if use_pdl else ''}",
                       output_gate_kernel, dict(o=ACT[act], gate=ACT[act], out=ACT[act], outq=ACT[act], s_in=ACT[act],
                                                row_scale=ACT[act]),
                       dict(BLOCK_T=block_t, BLOCK_D=block_d, USE_PDL=use_pdl, QUANT=False, SOFT=False), nw, 1)
            if T > 64:  # the FP8 o_proj's x pass fused in (prefill rows)
                yield (f"output_gate {act} T={T} D={D} fp8 out", output_gate_kernel,
                       dict(o=ACT[act], gate=ACT[act], out=ACT[act], outq="*fp8e4nv", s_in="*fp32", row_scale="*fp32"),
                       dict(BLOCK_T=block_t, BLOCK_D=block_d, USE_PDL=False, QUANT=True, SOFT=False), nw, 1)
    from kernels.rotary.triton.rotary import launch_config as rotary_config, rotary_kernel

    for act in ("bf16", "fp16"):
        for T, D in ((1, 256), (4096, 256), (4096, 128)):
            block_t, block_d, nw = rotary_config(T, D)
            for use_pdl in (False, True) if T == 1 else (False,):
                yield (f"rotary {act} T={T} D={D} {block_t}x{block_d} w={nw}{' pdl' if use_pdl else ''}", rotary_kernel,
                       dict(x=ACT[act], cos=ACT[act], sin=ACT[act], out=ACT[act]),
                       dict(BLOCK_T=block_t, BLOCK_D=block_d, USE_PDL=use_pdl), nw, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--filter", default="", help="only configurations whose name contains this")
    args = ap.parse_args()
    print(f"triton {triton.__version__}, target sm_90")
    failed = 0
    for group in (attention_cases, moe_cases, linear_cases, norm_cases):
        for name, fn, types, c, nw, ns in group():
            if args.filter not in name:
                continue
            try:
                regs, stack, shared = compile_one(fn, types, c, nw, ns)
                print(f"OK   {name}: regs {regs} stack {stack} shared {shared}", flush=True)
            except Exception as exc:  # noqa: BLE001 - report every failure, exit non-zero
                failed += 1
                msg = " | ".join(str(exc).strip().splitlines()[-3:])[:400]
                print(f"FAIL {name}: {type(exc).__name__}: {msg}", flush=True)
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
