"""Quantized linear kernels against the bf16 GEMM on one GPU: per-call time of y = x @ W^T for
bf16 (F.linear, cuBLAS), fp8_linear (auto route, and each route forced), fp8_block_linear and
int4_linear (gdn_export/ops/quant_linear/gpu.py; as routed and their Triton GEMMs forced; the
CUDA-core GEMV of triton_gemv.py at M = 1), at decode (M = 1, 32) and prefill (M = 4096) rows
of the 1.66B Qwen3.5 projection shapes and a 9B-class MLP.

    python benchmarks/quant_linear_bench.py [--m 1 32 4096] [--json OUT.json]

Each op is captured in a CUDA graph that calls it once for each of R weight copies (R copies hold
>= 512 MB, so weights stream from HBM rather than the 60 MB L2, as in a model's decode step); the
time per call is the median over replays (triton.testing.do_bench) divided by R. Ratios are against
bf16 on the same shape. Also prints which torch._scaled_mm forms (rowwise, blockwise 1x128 x 128x128) gpu.py found usable.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch
import triton

from kernels.quant_linear import gpu
from kernels.quant_linear.triton import common as triton_common, fp8 as triton_fp8, gemv as triton_gemv, int4 as triton_int4

# (name, K, N): 1.66B Qwen3.5 (hidden 2048; GDN q+k+v 8192, z 4096, out 4096 -> 2048; attention
# q+gate 8192, k / v 512, o 4096 -> 2048; MLP gate / up 6144, down 6144 -> 2048); 9B-class MLP.
SHAPES = [
    ("gdn_qkv/attn_q", 2048, 8192),
    ("gdn_z", 2048, 4096),
    ("gdn_out/attn_o", 4096, 2048),
    ("attn_k/v", 2048, 512),
    ("mlp_gate/up", 2048, 6144),
    ("mlp_down", 6144, 2048),
    ("9b_mlp_up", 4096, 12288),
    ("9b_mlp_down", 12288, 4096),
]


def make_weights(K, N, dev):
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
    ws = w.float().abs().amax(1) / 448
    w8 = (w.float() / ws[:, None]).to(torch.float8_e4m3fn)
    KB, NB = math.ceil(K / 128), math.ceil(N / 128)
    wsi = torch.rand(NB, KB, device=dev) * 1e-4 + 1e-5
    qw = torch.randint(0, 256, (N, math.ceil(K / 2)), device=dev, dtype=torch.uint8)
    sc = (torch.rand(N, math.ceil(K / 128), device=dev) * 0.01 + 0.001).to(torch.bfloat16)
    return dict(bf16=w, w8=w8, ws=ws, wsi=wsi, qw=qw, sc=sc)


def forced_triton_fp8(x, w8, ws, s_in):
    return triton_fp8.fp8_gemm(x, w8, ws, s_in, None, blockwise=False)


def forced_scaled_mm(x, w8, ws, s_in):
    xq, rs = triton_fp8.quantize_tensor(x, s_in)
    return torch._scaled_mm(xq, w8.t(), scale_a=rs, scale_b=ws.view(1, -1), out_dtype=x.dtype)


METHODS = {
    "bf16": lambda x, W, s: torch.nn.functional.linear(x, W["bf16"]),
    "fp8": lambda x, W, s: gpu.fp8_linear(x, W["w8"], W["ws"], s),
    "fp8_triton": lambda x, W, s: forced_triton_fp8(x, W["w8"], W["ws"], s),
    "fp8_scaled_mm": lambda x, W, s: forced_scaled_mm(x, W["w8"], W["ws"], s),
    "fp8_block": lambda x, W, s: gpu.fp8_block_linear(x, W["w8"], W["wsi"]),
    "fp8_block_triton": lambda x, W, s: triton_fp8.fp8_gemm(x, W["w8"], W["wsi"], None, None, blockwise=True),
    "int4": lambda x, W, s: gpu.int4_linear(x, W["qw"], W["sc"]),
    "int4_triton": lambda x, W, s: triton_int4.int4_gemm(x, W["qw"], W["sc"]),
    # CUDA-core GEMV (M = 1 only; NaN elsewhere)
    "fp8_gemv": lambda x, W, s: triton_gemv.gemv(triton_gemv.FP8_TENSOR, x, W["w8"], W["ws"], s),
    "fp8_block_gemv": lambda x, W, s: triton_gemv.gemv(triton_gemv.FP8_BLOCK, x, W["w8"], W["wsi"]),
    "int4_gemv": lambda x, W, s: triton_gemv.gemv(triton_gemv.INT4, x, W["qw"], W["sc"]),
}


def time_method(fn, x, copies, s_in):
    """Median time per call (us) of fn over the weight copies, replayed from one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for W in copies:
            fn(x, W, s_in)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for W in copies:
            fn(x, W, s_in)
    ms = triton.testing.do_bench(lambda: graph.replay(), warmup=25, rep=150, return_mode="median")
    return 1000 * ms / len(copies)


def probe_blockwise_scaled_mm(dev):
    """torch._scaled_mm's forms as gpu.py probes them (runs and agrees with the fp32 product)."""
    return [f"{'blockwise' if bw else 'rowwise'} {str(dt)[6:]}{' +bias' if bias else ''}: "
            f"{gpu._scaled_mm_ok(dt, bias, dev, blockwise=bw)}"
            for bw in (False, True) for dt in (torch.bfloat16, torch.float16) for bias in (False, True)]


SWEEP = [dict(BN=bn, warps=w, stages=st, per_sm=ps) for bn, w, st, ps in
         [(64, 4, 4, 2), (32, 4, 4, 2), (128, 4, 4, 2), (64, 4, 4, 4)]]


def sweep(dev, min_bytes):
    """(after the main table) Skinny-launch parameters (triton_common.SKINNY) timed for fp8, fp8_block and int4 at M = 1, 32."""
    default = dict(triton_common.SKINNY)
    print("| skinny config | shape | M | fp8 us | fp8 block us | int4 us |")
    print("|---|---|---|---|---|---|")
    for name, K, N in [("gdn_qkv/attn_q", 2048, 8192), ("gdn_out/attn_o", 4096, 2048), ("attn_k/v", 2048, 512)]:
        R = max(2, min(64, math.ceil(min_bytes / (2 * K * N))))
        copies = [make_weights(K, N, dev) for _ in range(R)]
        for M in (1, 32):
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            s_in = (x.float().abs().amax() / 448).reshape(())
            for cfg in SWEEP:
                triton_common.SKINNY.update(cfg)
                t = [time_method(METHODS[m], x, copies, s_in) for m in ("fp8", "fp8_block", "int4")]
                print(f"| {cfg} | {name} | {M} | {t[0]:.2f} | {t[1]:.2f} | {t[2]:.2f} |", flush=True)
        del copies
    triton_common.SKINNY.update(default)


GEMV_SWEEP = [dict(BN=bn, BK=bk, warps=w, stages=st, per_sm=ps) for bn, bk, w, st, ps in
              [(32, 128, 4, 2, 4), (16, 128, 4, 3, 4), (16, 256, 4, 3, 2), (8, 256, 2, 3, 4), (32, 256, 8, 3, 2),
               (16, 128, 2, 4, 8), (64, 128, 8, 2, 2), (8, 512, 4, 2, 2)]]


def sweep_gemv(dev, min_bytes):
    """The one-row GEMV's launch parameters (triton_gemv.CFG) for fp8, fp8_block (BK 128 only) and int4."""
    default = dict(triton_gemv.CFG)
    print("| gemv config | shape | bf16 us | fp8 us | fp8 block us | int4 us |")
    print("|---|---|---|---|---|---|")
    for name, K, N in [("gdn_qkv/attn_q", 2048, 8192), ("gdn_out/attn_o", 4096, 2048), ("mlp_down", 6144, 2048),
                       ("attn_k/v", 2048, 512)]:
        R = max(2, min(64, math.ceil(min_bytes / (2 * K * N))))
        copies = [make_weights(K, N, dev) for _ in range(R)]
        x = torch.randn(1, K, device=dev, dtype=torch.bfloat16)
        s_in = (x.float().abs().amax() / 448).reshape(())
        b = time_method(METHODS["bf16"], x, copies, s_in)
        for cfg in GEMV_SWEEP:
            triton_gemv.CFG.update(cfg)
            t = []
            for m in ("fp8_gemv", "fp8_block_gemv", "int4_gemv"):
                try:
                    t.append(f"{time_method(METHODS[m], x, copies, s_in):.2f}")
                except Exception as exc:  # a config that does not fit the shape / format
                    t.append(type(exc).__name__)
            print(f"| {cfg} | {name} | {b:.2f} | {t[0]} | {t[1]} | {t[2]} |", flush=True)
        del copies
    triton_gemv.CFG.update(default)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, nargs="+", default=[1, 32, 4096], help="rows M (default 1 32 4096)")
    p.add_argument("--json", help="write all timings here")
    p.add_argument("--sweep", action="store_true", help="then time skinny-launch parameters (M = 1, 32)")
    p.add_argument("--sweep-gemv", action="store_true", help="then time one-row GEMV launch parameters")
    p.add_argument("--min-bytes", type=float, default=512e6, help="bf16 weight bytes the copies hold (default 512e6)")
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", file=sys.stderr)
    for line in probe_blockwise_scaled_mm(dev):
        print("_scaled_mm probe:", line)
    rows = []
    for name, K, N in SHAPES:
        R = max(2, min(64, math.ceil(args.min_bytes / (2 * K * N))))
        copies = [make_weights(K, N, dev) for _ in range(R)]
        for M in args.m:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            s_in = (x.float().abs().amax() / 448).reshape(())
            res = {}
            for meth, fn in METHODS.items():
                if meth.endswith("gemv") and M != 1:
                    res[meth] = float("nan")
                    continue
                try:
                    res[meth] = time_method(fn, x, copies, s_in)
                except Exception as exc:
                    res[meth] = float("nan")
                    print(f"{name} M={M} {meth}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}",
                          file=sys.stderr)
            rows.append(dict(shape=name, M=M, K=K, N=N, **res))
            print(f"{name:16s} M={M:5d} " + " ".join(f"{k}={v:8.2f}" for k, v in res.items()), file=sys.stderr,
                  flush=True)
        del copies
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    # summary table: us per call and ratio to bf16
    hdr = ("| shape | K | N | M | bf16 us | fp8 | fp8 triton | fp8 _scaled_mm | fp8 block | fp8 block triton | "
           "int4 | int4 triton | fp8 gemv | fp8 block gemv | int4 gemv |")
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    for r in rows:
        b = r["bf16"]
        cell = lambda k: f"{r[k]:.1f} ({r[k] / b:.2f}x)"  # noqa: E731
        print(f"| {r['shape']} | {r['K']} | {r['N']} | {r['M']} | {b:.1f} | {cell('fp8')} | {cell('fp8_triton')} | "
              f"{cell('fp8_scaled_mm')} | {cell('fp8_block')} | {cell('fp8_block_triton')} | {cell('int4')} | "
              f"{cell('int4_triton')} | {cell('fp8_gemv')} | {cell('fp8_block_gemv')} | {cell('int4_gemv')} |")
    for M in args.m:
        sel = [r for r in rows if r["M"] == M and not r["shape"].startswith("9b")]
        tot = {k: sum(r[k] for r in sel) for k in METHODS}
        print(f"1.66B shapes, M={M}: sum over shapes, ratio to bf16: " +
              ", ".join(f"{k} {tot[k] / tot['bf16']:.2f}" for k in METHODS if k != "bf16"))
    if args.sweep:
        sweep(dev, args.min_bytes)
    if args.sweep_gemv:
        sweep_gemv(dev, args.min_bytes)


if __name__ == "__main__":
    main()
