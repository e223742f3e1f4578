"""Where the CUDA (plugin) prefill's time goes: per-kernel GPU time of the cuda backend's chunked path,
with its sequential pass pinned to each implementation (wmma walk, mma.sync walk on 1 / 2 / 4 warps),
and under the shared memory of smaller GPUs (99 KB: sm_86 / 89 / 120, where the walk is single-buffered;
the 1- and 2-warp walks always are).

    PYTHONPATH=$PWD python3 benchmarks/cuda_prefill_profile.py [--out-dir DIR] [--calls 5]

bf16, Dk = Dv = 128, correlated SiLU keys and slow decay (prefill_pack_bench's inputs), fp32 initial
state. Kernel times are torch.profiler means over `calls` calls after a warm-up; one markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from gpu_timing import save_table
from records import out_dir
from prefill_pack_bench import _tokens

CASES = [("1 x 16K, Hv = 2Hk", 16, 32, 1, 16384), ("8 x 8K, Hv = 3Hk", 16, 48, 8, 8192),
         ("1 x 16K, Hv = Hk", 16, 16, 1, 16384)]
PATHS = ["auto", "wmma", "walk1", "walk2", "walk4", "walk4 @99KB"]


def kernel_ms(fn, calls):
    """{kernel name: mean GPU ms per call} over `calls` calls of fn."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.device_time_total > 0:
            name = e.key.split("<")[0].split("(")[0].removeprefix("void ").removeprefix("gdn::kernels::")
            out[name] = out.get(name, 0.0) + e.device_time_total / 1000.0 / calls
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args(argv)
    args.out_dir = out_dir(args.out_dir, "cuda_prefill_profile")
    from gdn_export.ops.gated_delta_rule import cuda as cb
    pins = {"auto": (cb.PATH_AUTO, 0), "wmma": (cb.PATH_CHUNKED_WMMA, 0),
            **{f"walk{w}": (p, 0) for w, p in cb.PATH_CHUNKED_WALK.items()},
            "walk4 @99KB": (cb.PATH_CHUNKED_WALK[4], cb.SMEM_SM86)}
    rows = []
    for name, hk, hv, B, T in CASES:
        q, k, v, g, beta = (x.reshape(B, T, *x.shape[2:]) for x in _tokens(B * T, hk, hv))
        s0 = torch.randn(B, hv, 128, 128, device="cuda") * 0.1
        for path in PATHS:
            pin, smem = pins[path]
            ms = kernel_ms(lambda: cb.gated_delta_rule(q, k, v, g, beta, s0, 128 ** -0.5, True, None,
                                                       path=pin, smem_limit=smem), args.calls)
            gdn = {n: t for n, t in ms.items() if "gatedDeltaRule" in n}
            row = dict(case=name, path=path, total=sum(gdn.values()),
                       kernels=", ".join(f"{n.removeprefix('gatedDeltaRule')} {t:.3f}" for n, t in gdn.items()))
            print(row, flush=True)
            rows.append(row)
    lines = [f"{torch.cuda.get_device_name()}, bf16, Dk = Dv = 128; GPU ms per call (torch.profiler mean)", "",
             "| case | sequential pass | gdn kernels total | per kernel |", "|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['path']} | {r['total']:.3f} | {r['kernels']} |" for r in rows]
    save_table(args.out_dir, "cuda_prefill_profile", rows, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
