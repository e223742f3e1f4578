"""Time the cuda backend's kernels on the current GPU, beside the Triton backend and FLA if present.

    PYTHONPATH=$PWD python3 benchmarks/cuda_kernels_bench.py --out results.md

Decode steps are timed as CUDA-graph replays (GPU time, no launch gaps); prefill with
triton.testing.do_bench (median). Shapes follow Qwen3-Next's linear attention: Dk = Dv = 128,
Hv = 32, bf16, L2-normalised q and k.
"""

from __future__ import annotations

import argparse
import datetime
import sys

import torch
import torch.nn.functional as F

from gdn_export.ops.causal_conv1d import cuda as conv_cuda
from gdn_export.ops.gated_delta_rule import cuda as gdr_cuda
from gpu_timing import copy_tbps, graph_ms, median_ms

HV, D = 32, 128


def _cell(ms: float) -> str:
    """A table cell: the time, or "-" where that implementation was not timed (nan)."""
    return "-" if ms != ms else f"{ms:.3f}"


def _inputs(B, T, Hk, Hv, dtype=torch.bfloat16):
    dev = "cuda"
    q = torch.randn(B, T, Hk, D, device=dev, dtype=dtype)
    k = torch.randn(B, T, Hk, D, device=dev, dtype=dtype)
    v = torch.randn(B, T, Hv, D, device=dev, dtype=dtype)
    g = -F.softplus(torch.randn(B, T, Hv, device=dev)) * 0.1
    beta = torch.sigmoid(torch.randn(B, T, Hv, device=dev)).to(dtype)
    return q, k, v, g, beta


def bench_decode(rows, bw, with_triton=True):
    fused_recurrent_gated_delta_rule = None
    if with_triton:
        try:
            from kernels.gated_delta_rule.triton.fused_recurrent import fused_recurrent_gated_delta_rule
        except Exception as exc:  # noqa: BLE001
            print("triton decode unavailable:", exc)
    for B in (1, 64, 256):
        q, k, v, g, beta = _inputs(B, 1, 16, HV)
        state = torch.randn(B, HV, D, D, device="cuda") * 0.1
        o = torch.empty_like(v)
        scale = D**-0.5
        run = lambda: gdr_cuda.gated_delta_rule_out(q, k, v, g, beta, state, scale, True, None, o, state)  # noqa: E731
        ms = graph_ms(run)
        bytes_ = 2 * state.numel() * 4 + 2 * (q.numel() + k.numel() + v.numel() + o.numel())
        tri = float("nan")
        if fused_recurrent_gated_delta_rule is not None:
            try:
                s2 = state.clone()
                tri = graph_ms(lambda: fused_recurrent_gated_delta_rule(
                    q, k, v, g, beta, s2, scale, True, None, inplace=True, out=o))
            except Exception as exc:  # noqa: BLE001
                print("triton decode failed:", str(exc).splitlines()[0])
        rows.append([f"decode B={B} Hk=16 Hv=32 D=128 bf16", ms * 1e3, "us",
                     f"{bytes_ / ms / 1e9:.2f} TB/s = {bytes_ / ms / 1e9 / bw:.0%} of copy", tri * 1e3, float("nan")])


def _fla():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        return chunk_gated_delta_rule
    except Exception as exc:  # noqa: BLE001
        print("FLA unavailable:", str(exc).splitlines()[0])
        return None


PREFILL_SHAPES = ((1, 16384), (1, 65536), (8, 8192))


def bench_prefill(rows, which, emit):
    """Fill the `which` column (0 cuda, 1 triton, 2 FLA) of the prefill rows, one shape at a time."""
    scale = D**-0.5
    fn = None
    if which == 0:
        fn = lambda q, k, v, g, beta: gdr_cuda.gated_delta_rule(q, k, v, g, beta, None, scale, True, None)  # noqa: E731
    elif which == 1:
        try:
            from gdn_export.ops import triton_backend
            fn = lambda q, k, v, g, beta: triton_backend.gated_delta_rule(  # noqa: E731
                q, k, v, g, beta, None, scale, True, None)
        except Exception as exc:  # noqa: BLE001
            print("triton backend unavailable:", str(exc).splitlines()[0])
    else:
        fla = _fla()
        if fla is not None:
            fn = lambda q, k, v, g, beta: fla(q, k, v, g, beta, scale=scale, output_final_state=True,  # noqa: E731
                                              use_qk_l2norm_in_kernel=True)
    for B, T in PREFILL_SHAPES:
        label = f"prefill B={B} T={T} H=32 D=128 bf16"
        row = next((r for r in rows if r[0] == label), None)
        if row is None:
            row = [label, float("nan"), "ms", "", float("nan"), float("nan")]
            rows.append(row)
        if fn is None:
            continue
        q, k, v, g, beta = _inputs(B, T, HV, HV)
        try:
            ms = median_ms(lambda: fn(q, k, v, g, beta))
        except Exception as exc:  # noqa: BLE001
            print(f"prefill column {which} failed:", str(exc).splitlines()[0])
            ms = float("nan")
        if which == 0:
            flops = B * HV * T * 2 * (3 * 64 * D + 4 * D * D)  # rough chunk-form count
            row[1], row[3] = ms, f"{flops / ms / 1e9:.0f} TFLOP/s (rough)"
        else:
            row[3 + which] = ms
        del q, k, v, g, beta
        torch.cuda.empty_cache()
        emit()


def kernel_breakdown(B=1, T=16384):
    q, k, v, g, beta = _inputs(B, T, HV, HV)
    fn = lambda: gdr_cuda.gated_delta_rule(q, k, v, g, beta, None, D**-0.5, True, None)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    print(f"kernel breakdown, prefill B={B} T={T}:")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))


def bench_conv(rows, bw):
    C, K = 8192, 4
    for B, T in ((1, 16384), (64, 1), (256, 1)):
        x = torch.randn(B, T, C, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(C, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(C, device="cuda", dtype=torch.bfloat16)
        s = torch.randn(B, C, K - 1, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        run = lambda: conv_cuda.causal_conv1d_out(x, w, b, s, True, y, s)  # noqa: E731
        ms = graph_ms(run) if T == 1 else median_ms(run)
        bytes_ = 2 * (2 * x.numel() + 2 * s.numel())
        rows.append((f"conv B={B} T={T} C={C} K={K} bf16", ms * 1e3, "us",
                     f"{bytes_ / ms / 1e9:.2f} TB/s = {bytes_ / ms / 1e9 / bw:.0%} of copy", float("nan"), float("nan")))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="markdown file for the table")
    ap.add_argument("--only-cuda", action="store_true", help="skip the Triton and FLA columns")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    name = torch.cuda.get_device_name()
    bw = copy_tbps()
    rows = []

    def emit():
        lines = [
            f"# cuda backend kernels, {name}, {datetime.date.today()}",
            "",
            f"Command: `PYTHONPATH=$PWD python3 {' '.join(sys.argv)}`; torch {torch.__version__}; "
            f"device-to-device copy {bw:.2f} TB/s (read + write). Times: decode and conv decode in us of GPU "
            "time per step (CUDA graph replay), prefill in ms (do_bench median).",
            "",
            "| case | cuda | unit | rate | triton | FLA |",
            "| --- | ---: | --- | --- | ---: | ---: |",
        ]
        for case, t, unit, rate, tri, fl in rows:
            lines.append(f"| {case} | {t:.3f} | {unit} | {rate} | {_cell(tri)} | {_cell(fl)} |")
        table = "\n".join(lines) + "\n"
        if args.out:
            with open(args.out, "w") as f:
                f.write(table)
        return table

    bench_decode(rows, bw, not args.only_cuda)
    bench_conv(rows, bw)
    bench_prefill(rows, 0, emit)
    try:
        kernel_breakdown()
    except Exception as exc:  # noqa: BLE001
        print("profiler failed:", exc)
    if not args.only_cuda:
        bench_prefill(rows, 1, emit)
        bench_prefill(rows, 2, emit)
    print(emit())


if __name__ == "__main__":
    main()
