"""Quantized linear kernels against the bf16 GEMM on one GPU, in GB/s against the copy bandwidth.

    python benchmarks/quant_linear_bench.py [--m 1 8 32 64 4096] [--json OUT.json] [--sweep-skinny]
    python benchmarks/quant_linear_bench.py --roofline [--copy-tbps 3.0 --tflops 790]   # no GPU

Shapes: the GEMMs a 1.66B Qwen3.5 decode step runs on the GPU path, sibling projections fused
(gdn_export.modules.quant_fusion): GDN q|k|v|z 2048 -> 12288 (18 a step), attention q|gate|k|v
2048 -> 9216 (6), GDN / attention out 4096 -> 2048 (24), MLP gate|up 2048 -> 12288 (24), MLP down
6144 -> 2048 (24), the tied lm_head 2048 -> 248320 (1; not at prefill sizes: prefill projects the
last token only).

Columns (kernels.quant_linear.gpu): bf16 `F.linear` (cuBLAS); fp8 / fp8 block / int4 as routed by
default (the Triton GEMMs of fp8.py / int4.py for M <= 32, _scaled_mm for fp8 with N >= 6144 or M >
32; int4 with its AWQ pre_scale, a separate multiply there); `skinny`: M <= 64 through the skinny
GEMM of triton/skinny.py (gpu.SKINNY_DECODE; int4's pre_scale applied in the kernel); `shifts`:
int4 nibbles by shifts and conversions instead of triton_utils.int4_nibbles' PTX (NIBBLE_PTX off); fp8
_scaled_mm: x quantized by one Triton pass, then torch._scaled_mm rowwise; at prefill rows (M > 64)
also with `use_fast_accum` (`fast`) and in the tensorwise form with one weight scale (`tensorwise`).

Each op is captured in a CUDA graph that calls it once for each of R weight copies (R copies hold
>= --min-bytes of bf16 weights, so weights stream from HBM rather than L2, as in a model's decode
step); the time per call is the median over replays (triton.testing.do_bench) divided by R. GB/s
counts the bytes a call must move (weights, scales, x, y); the copy bandwidth is measured in the same
run (a device-to-device copy of 2 GiB, bytes read + written). A per-step sum weights each shape by its
count in the 24-layer model.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

# (name, K, N, GEMMs of this shape in one 1.66B decode step)
SHAPES = [
    ("gdn_qkvz", 2048, 12288, 18),
    ("attn_qkv", 2048, 9216, 6),
    ("out_proj", 4096, 2048, 24),
    ("mlp_gate_up", 2048, 12288, 24),
    ("mlp_down", 6144, 2048, 24),
    ("lm_head", 2048, 248320, 1),
]
FORMAT_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "int4": 0.5}


def moved_bytes(fmt: str, M: int, K: int, N: int) -> float:
    """Bytes one call must move: weight, its scales, x (bf16) read, y (bf16) written."""
    w = K * N * FORMAT_BYTES[fmt]
    scales = {"bf16": 0, "fp8": 4 * N, "fp8_block": 4 * math.ceil(N / 128) * math.ceil(K / 128),
              "int4": 2 * N * math.ceil(K / 128) + 2 * K}[fmt]
    return w + scales + 2 * M * K + 2 * M * N


def roofline(ms: list[int], copy_tbps: float, tflops: float) -> str:
    """Table: per shape and M, the bytes floor (copy bandwidth) and the FLOP floor (bf16 tensor rate;
    fp8 at twice it) in us, for bf16, fp8 and int4 weights."""
    lines = [f"Floors at {copy_tbps} TB/s copy bandwidth and {tflops} TFLOP/s bf16 ({2 * tflops:.0f} fp8); "
             "us per call = max(bytes / bandwidth, FLOPs / rate)",
             "",
             "| shape | K | N | M | GFLOP | bf16 MB | bf16 us | fp8 MB | fp8 us | int4 MB | int4 us | fp8 / bf16 | "
             "int4 / bf16 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, K, N, _ in SHAPES:
        for M in ms:
            if name == "lm_head" and M > 64:
                continue
            flop = 2 * M * K * N
            t = {}
            for fmt, rate in (("bf16", tflops), ("fp8", 2 * tflops), ("int4", tflops)):
                t[fmt] = max(moved_bytes(fmt, M, K, N) / (copy_tbps * 1e12), flop / (rate * 1e12)) * 1e6
            lines.append(f"| {name} | {K} | {N} | {M} | {flop / 1e9:.3g} | {moved_bytes('bf16', M, K, N) / 1e6:.1f} | "
                         f"{t['bf16']:.2f} | {moved_bytes('fp8', M, K, N) / 1e6:.1f} | {t['fp8']:.2f} | "
                         f"{moved_bytes('int4', M, K, N) / 1e6:.1f} | {t['int4']:.2f} | {t['fp8'] / t['bf16']:.2f} | "
                         f"{t['int4'] / t['bf16']:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, nargs="+", default=[1, 8, 32, 64, 4096], help="rows M (default 1 8 32 64 4096)")
    p.add_argument("--json", help="write all timings here")
    p.add_argument("--shapes", nargs="+", help="only these shapes (names of SHAPES)")
    p.add_argument("--sweep-skinny", action="store_true",
                   help="first time skinny-GEMM launch parameters (and the GEMV and int4_dequant tiles), then run "
                   "the table with the fastest of each format (written to --tuned)")
    p.add_argument("--sweep-only", action="store_true", help="--sweep-skinny without the table")
    p.add_argument("--sweep-configs", type=int, default=None, help="--sweep-skinny: the first N launch configurations")
    p.add_argument("--tuned", help="--sweep-skinny: write the chosen launch parameters here (JSON, read by "
                   "apply_tuned / quant_gpu.sh's end-to-end runs)")
    p.add_argument("--min-bytes", type=float, default=512e6, help="bf16 weight bytes the copies hold (default 512e6)")
    p.add_argument("--roofline", action="store_true", help="print the floors only (no GPU)")
    p.add_argument("--copy-tbps", type=float, default=3.0, help="--roofline: copy bandwidth, TB/s (default 3.0: H100)")
    p.add_argument("--tflops", type=float, default=790.0, help="--roofline: bf16 tensor rate (default 790)")
    args = p.parse_args(argv)
    if args.roofline:
        print(roofline(args.m, args.copy_tbps, args.tflops))
        return 0
    return GpuBench(args).run()


class GpuBench:
    def __init__(self, args):
        import torch
        import triton

        from kernels.quant_linear import gpu
        from kernels.quant_linear.triton import fp8 as triton_fp8, skinny

        self.torch, self.triton, self.gpu, self.skinny, self.triton_fp8 = torch, triton, gpu, skinny, triton_fp8
        self.args = args
        self.dev = torch.device("cuda")

    # ------------------------------------------------------------------ weights and methods
    def make_weights(self, K, N):
        torch, dev = self.torch, self.dev
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
        ws = w.float().abs().amax(1) / 448
        w8 = (w.float() / ws[:, None]).to(torch.float8_e4m3fn)
        wsi = torch.rand(math.ceil(N / 128), math.ceil(K / 128), device=dev) * 1e-4 + 1e-5
        qw = torch.randint(0, 256, (N, math.ceil(K / 2)), device=dev, dtype=torch.uint8)
        sc = (torch.rand(N, math.ceil(K / 128), device=dev) * 0.01 + 0.001).to(torch.bfloat16)
        pre = (torch.rand(K, device=dev) + 0.5).to(torch.bfloat16)
        return dict(bf16=w, w8=w8, ws=ws, wsi=wsi, qw=qw, sc=sc, pre=pre)

    def methods(self):
        torch, gpu, tf8 = self.torch, self.gpu, self.triton_fp8

        from kernels import triton_utils

        def with_flag(module, name, value):
            """fn run with module.name = value (restored to its opposite after each call)."""
            def wrap(fn):
                def run(x, W, s):
                    setattr(module, name, value)
                    try:
                        return fn(x, W, s)
                    finally:
                        setattr(module, name, not value)
                return run
            return wrap

        skinny = with_flag(gpu, "SKINNY_DECODE", True)
        # the nibbles by shifts and conversions rather than triton_utils.int4_nibbles' PTX
        shifts = with_flag(triton_utils, "NIBBLE_PTX", False)

        def scaled_mm(x, W, s, fast=False):
            xq, rs = tf8.quantize_tensor(x, s)
            return torch._scaled_mm(xq, W["w8"].t(), scale_a=rs, scale_b=W["ws"].view(1, -1), out_dtype=x.dtype,
                                    use_fast_accum=fast)

        # the prefill GEMM's alternatives (cuBLASLt reached 64% of its FP8 peak at M = 4096 on the H100,
        # bf16 80%): the same rowwise call with fast accumulation (no periodic promotion to fp32), and
        # the tensorwise form (one scale each: a per-tensor weight scale, ModelOpt's FP8 default for a
        # Linear outside a fused sibling group)

        def scaled_mm_tensorwise(x, W, s):
            xq, _ = tf8.quantize_tensor(x, s)
            return torch._scaled_mm(xq, W["w8"].t(), scale_a=s.reshape(()), scale_b=W["ws"][:1].reshape(()),
                                    out_dtype=x.dtype)

        return {
            "bf16": ("bf16", lambda x, W, s: torch.nn.functional.linear(x, W["bf16"])),
            "fp8": ("fp8", lambda x, W, s: gpu.fp8_linear(x, W["w8"], W["ws"], s)),
            "fp8_skinny": ("fp8", skinny(lambda x, W, s: gpu.fp8_linear(x, W["w8"], W["ws"], s))),
            "fp8_scaled_mm": ("fp8", scaled_mm),
            "fp8_scaled_mm_fast": ("fp8", lambda x, W, s: scaled_mm(x, W, s, fast=True)),
            "fp8_scaled_mm_tensorwise": ("fp8", scaled_mm_tensorwise),
            "fp8_block": ("fp8_block", lambda x, W, s: gpu.fp8_block_linear(x, W["w8"], W["wsi"])),
            "fp8_block_skinny": ("fp8_block", skinny(lambda x, W, s: gpu.fp8_block_linear(x, W["w8"], W["wsi"]))),
            "int4": ("int4", lambda x, W, s: gpu.int4_linear(x, W["qw"], W["sc"], None, 128, W["pre"])),
            "int4_skinny": ("int4", skinny(lambda x, W, s: gpu.int4_linear(x, W["qw"], W["sc"], None, 128, W["pre"]))),
            "int4_shifts": ("int4", shifts(lambda x, W, s: gpu.int4_linear(x, W["qw"], W["sc"], None, 128, W["pre"]))),
            "int4_skinny_shifts": ("int4", shifts(skinny(
                lambda x, W, s: gpu.int4_linear(x, W["qw"], W["sc"], None, 128, W["pre"])))),
        }

    def time_method(self, fn, x, copies, s_in):
        """Median us per call of fn over the weight copies, replayed from one CUDA graph."""
        torch = self.torch
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
        ms = self.triton.testing.do_bench(graph.replay, warmup=10, rep=60, return_mode="median")
        del graph
        return 1000 * ms / len(copies)

    def copy_bandwidth(self) -> float:
        """TB/s of a 2 GiB device-to-device copy, bytes read + written (median of replays)."""
        torch = self.torch
        a = torch.randn(2 ** 29, device=self.dev)
        b = torch.empty_like(a)
        ms = self.triton.testing.do_bench(lambda: b.copy_(a), warmup=20, rep=100, return_mode="median")
        tbps = 2 * a.numel() * 4 / (ms * 1e-3) / 1e12
        del a, b
        return tbps

    def copies_for(self, K, N):
        R = max(2, min(64, math.ceil(self.args.min_bytes / (2 * K * N))))
        return [self.make_weights(K, N) for _ in range(R)]

    # ------------------------------------------------------------------ runs
    def run(self) -> int:
        torch, args = self.torch, self.args
        name = torch.cuda.get_device_name()
        print(f"{name} torch {torch.__version__} triton {self.triton.__version__}", file=sys.stderr)
        for bw in (False, True):
            for dt in (torch.bfloat16,):
                print(f"_scaled_mm probe: {'blockwise' if bw else 'rowwise'} {str(dt)[6:]}: "
                      f"{self.gpu._scaled_mm_ok(dt, False, self.dev, blockwise=bw)}", file=sys.stderr)
        copy = self.copy_bandwidth()
        print(f"copy bandwidth {copy:.2f} TB/s (2 GiB device-to-device, read + write)", file=sys.stderr)
        sweep = []
        if args.sweep_skinny:
            sweep = self.sweep_skinny(copy)
            tuned = pick_tuned(sweep)
            apply_tuned(tuned)
            print(f"tuned: {json.dumps(tuned)}", file=sys.stderr)
            if args.tuned:
                with open(args.tuned, "w") as f:
                    json.dump(tuned, f, indent=1)
            if args.sweep_only:
                return 0
        elif args.tuned:  # the launch parameters an earlier sweep chose
            with open(args.tuned) as f:
                apply_tuned(json.load(f))
        methods = self.methods()
        rows = []
        shapes = [s for s in SHAPES if not args.shapes or s[0] in args.shapes]
        for sname, K, N, count in shapes:
            copies = self.copies_for(K, N)
            for M in args.m:
                if sname == "lm_head" and M > 64:
                    continue
                x = torch.randn(M, K, device=self.dev, dtype=torch.bfloat16)
                s_in = (x.float().abs().amax() / 448).reshape(())
                res = {}
                for meth, (fmt, fn) in methods.items():
                    if ("_skinny" in meth and M > self.skinny.MAX_M) or (meth == "int4_shifts" and M <= 64):
                        continue  # the same route as another column
                    if meth in ("fp8_scaled_mm_fast", "fp8_scaled_mm_tensorwise") and M <= self.skinny.MAX_M:
                        continue  # prefill alternatives only
                    try:
                        res[meth] = self.time_method(fn, x, copies, s_in)
                    except Exception as exc:  # one failed method must not cost the table
                        print(f"{sname} M={M} {meth}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                              file=sys.stderr)
                rows.append(dict(shape=sname, K=K, N=N, M=M, count=count, us=res,
                                 gbps={m: moved_bytes(methods[m][0], M, K, N) / (t * 1e-6) / 1e9 for m, t in res.items()}))
                print(f"{sname:12s} M={M:5d} " + " ".join(f"{k}={v:8.2f}" for k, v in res.items()), file=sys.stderr,
                      flush=True)
            del copies
            torch.cuda.empty_cache()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(device=name, torch=torch.__version__, triton=self.triton.__version__,
                               copy_tbps=copy, rows=rows, sweep=sweep), f, indent=1)
        print(table(rows, list(methods), copy, name))
        return 0

    # the last field: extra keys, timed for the formats they concern: nibbles (the INT4 nibble
    # conversion's form, triton_utils.NIBBLE_PTX) for int4 only, one_row (x's one row quantized alone
    # at M = 1) for the fp8 formats only
    SWEEP = [dict(BN=bn, BK=bk, warps=w, stages=st, per_sm=None, dot_fp8=d, min_tiles=mt, **extra)
             for bn, bk, w, st, d, mt, extra in [
                 (64, 128, 4, 3, True, 4, {}), (64, 128, 4, 4, True, 8, {}), (64, 128, 4, 3, True, 4, {"nibbles": 2}),
                 (64, 128, 4, 4, True, 8, {"one_row": True}), (64, 128, 4, 3, True, 1, {}),
                 (128, 128, 4, 3, True, 1, {}), (64, 128, 4, 4, True, 1, {}), (128, 128, 4, 4, True, 4, {}),
                 (128, 128, 8, 3, True, 1, {})]]

    def sweep_skinny(self, copy):
        """Skinny-GEMM launch parameters (triton/skinny.py CFG) per format at M = 1 and 32."""
        torch, sk = self.torch, self.skinny
        out = []
        print("| skinny config | shape | M | fp8 us | fp8 block us | int4 us | fp8 GB/s (% copy) |")
        print("|---|---|---|---|---|---|---|")
        for sname, K, N, _ in [s for s in SHAPES if s[0] in ("gdn_qkvz", "mlp_down")]:
            copies = self.copies_for(K, N)
            for M in (1, 32):
                x = torch.randn(M, K, device=self.dev, dtype=torch.bfloat16)
                s_in = (x.float().abs().amax() / 448).reshape(())
                for cfg in self.SWEEP[:self.args.sweep_configs]:
                    t = {}
                    for fmt, fn in (
                            ("fp8", lambda x, W, s: sk.skinny(sk.FP8_TENSOR, x, W["w8"], W["ws"], s, cfg=cfg)),
                            ("fp8_block", lambda x, W, s: sk.skinny(sk.FP8_BLOCK, x, W["w8"], W["wsi"], cfg=cfg)),
                            ("int4", lambda x, W, s: sk.skinny(sk.INT4, x, W["qw"], W["sc"], None, None, 128, W["pre"],
                                                               cfg=cfg))):
                        if fmt == "int4" and cfg["dot_fp8"] is False:
                            continue  # int4 never takes fp8 MMAs: the same kernel as dot_fp8=True
                        if fmt != "int4" and "nibbles" in cfg:
                            continue  # the nibble conversion: int4 only
                        if fmt == "int4" and "one_row" in cfg:
                            continue  # x's one row quantized alone: the fp8 formats only
                        try:
                            t[fmt] = self.time_method(fn, x, copies, s_in)
                        except Exception as exc:
                            t[fmt] = float("nan")
                            print(f"sweep {cfg} {fmt}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}",
                                  file=sys.stderr)
                    gb = moved_bytes("fp8", M, K, N) / (t["fp8"] * 1e-6) / 1e9 if t.get("fp8") else float("nan")
                    out.append(dict(cfg=cfg, shape=sname, M=M, us=t))
                    cell = lambda k: f"{t[k]:.2f}" if k in t else "-"  # noqa: E731
                    print(f"| {cfg} | {sname} | {M} | {cell('fp8')} | {cell('fp8_block')} | {cell('int4')} | "
                          f"{gb:.0f} ({gb / 1e3 / copy:.0%}) |", flush=True)
            del copies
            torch.cuda.empty_cache()
        out += self.sweep_dequant(copy)
        return out

    def sweep_dequant(self, copy):
        """int4_dequant's tile (the int4 prefill's first pass) on the fused 2048 -> 12288 shape."""
        torch = self.torch
        from kernels.quant_linear.triton import int4 as ti

        out = []
        K, N = 2048, 12288
        copies = self.copies_for(K, N)
        print("\n| int4_dequant tile | us (2048 -> 12288) | GB/s (% copy) |\n|---|---|---|")
        # packed: each byte's two 16-bit values stored as one 32-bit word (no interleave through shared memory)
        for cfg in (dict(BN=8, BH=256, warps=4, packed=False), dict(BN=8, BH=256, warps=4, packed=True),
                    dict(BN=16, BH=128, warps=4, packed=True), dict(BN=4, BH=512, warps=4, packed=True),
                    dict(BN=16, BH=256, warps=8, packed=True), dict(BN=8, BH=512, warps=8, packed=True)):
            default = dict(ti.DEQUANT)
            ti.DEQUANT.update(cfg)
            try:
                t = self.time_method(lambda x, W, s: ti.int4_dequant(W["qw"], W["sc"], K, 128, torch.bfloat16), None,
                                     copies, None)
            finally:
                ti.DEQUANT.update(default)
            g = (K * N * 2.5) / (t * 1e-6) / 1e9
            out.append(dict(dequant=cfg, us=t))
            print(f"| {cfg} | {t:.1f} | {g:.0f} ({g / 1e3 / copy:.0%}) |", flush=True)
        del copies
        return out


def pick_tuned(sweep: list) -> dict:
    """{"skinny": {format name: the config with the least summed time over the swept shapes and rows},
    "dequant": int4_dequant's fastest tile}."""
    out = {"skinny": {}, "dequant": None}
    for fmt in ("fp8", "fp8_block", "int4"):
        totals = {}
        for r in sweep:
            if "cfg" in r and fmt in r["us"] and r["us"][fmt] == r["us"][fmt]:  # not NaN
                key = json.dumps(r["cfg"], sort_keys=True)
                totals.setdefault(key, []).append(r["us"][fmt])
        full = max((len(v) for v in totals.values()), default=0)
        best = min((sum(v), k) for k, v in totals.items() if len(v) == full) if totals else None
        if best:
            out["skinny"][fmt] = json.loads(best[1])
    deq = [r for r in sweep if "dequant" in r]
    if deq:
        out["dequant"] = min(deq, key=lambda r: r["us"])["dequant"]
    return out


def apply_tuned(tuned: dict) -> None:
    """Set the launch parameters of pick_tuned's result on the kernels of this process."""
    from kernels.quant_linear.triton import int4, skinny

    names = {"fp8": skinny.FP8_TENSOR, "fp8_block": skinny.FP8_BLOCK, "int4": skinny.INT4}
    for fmt, cfg in (tuned.get("skinny") or {}).items():
        skinny.CFG[names[fmt]].update(cfg)
    if tuned.get("dequant"):
        int4.DEQUANT.update(tuned["dequant"])


def table(rows, methods, copy, device) -> str:
    """us per call, GB/s and % of the copy bandwidth per shape and M; then per-step sums by M."""
    lines = [f"{device}; copy bandwidth {copy:.2f} TB/s. Cells: us per call / GB/s (% of copy) [x bf16's time]", "",
             "| shape | K | N | M | " + " | ".join(methods) + " |", "|---|---|---|---|" + "---|" * len(methods)]
    for r in rows:
        b = r["us"].get("bf16")
        cells = []
        for m in methods:
            if m not in r["us"]:
                cells.append("-")
                continue
            t, g = r["us"][m], r["gbps"][m]
            cells.append(f"{t:.1f} / {g:.0f} ({g / 1e3 / copy:.0%})" + (f" [{t / b:.2f}x]" if b and m != "bf16" else ""))
        lines.append(f"| {r['shape']} | {r['K']} | {r['N']} | {r['M']} | " + " | ".join(cells) + " |")
    lines += ["", "Per 1.66B step (each shape x its count; lm_head only at M <= 64), us and ratio to bf16:", "",
              "| M | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for M in sorted({r["M"] for r in rows}):
        sel = [r for r in rows if r["M"] == M]
        tot = {m: sum(r["us"][m] * r["count"] for r in sel) if all(m in r["us"] for r in sel) else None
               for m in methods}
        b = tot["bf16"]
        lines.append(f"| {M} | " + " | ".join("-" if tot[m] is None else
                                              f"{tot[m]:.0f}" + (f" ({tot[m] / b:.2f}x)" if b and m != "bf16" else "")
                                              for m in methods) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
