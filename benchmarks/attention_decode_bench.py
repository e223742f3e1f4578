"""Decode-step attention (S = 1) on a GPU: the split-KV Triton kernel vs the SDPA route (H200).

    PYTHONPATH=$PWD python3 benchmarks/attention_decode_bench.py [--quick] [--visible 1.0]
                                                                           [--out-dir DIR]

Times the op `gdn_export.ops.attention.attention`, which takes `kernels.attention.triton.decode` at
these shapes, against its SDPA route called explicitly (`_attention_sdpa`: the memory-efficient
kernel, B * Hkv thread blocks per query block). Shapes: H 16 with Hkv 2 (the 1.66B model) and
Hkv 4, D 256, bf16, B in {1, 8, 32}, L in {4128, 32800} cache slots; every query may read the
first `--visible` fraction of the slots (default all). Each implementation is captured in a CUDA
graph of 20 calls and the replay timed (median, triton.testing.do_bench); where one cache set
(K + V) is smaller than 4x the L2 cache, the calls rotate over enough sets that each reads its
cache from HBM. Reports us per call and % of the device-to-device copy bandwidth (measured in the
same run) for the bytes a call must move: K and V read once (the visible slots). A correctness
check of both routes against an fp32 reference runs first and stops the run on a failure. The
markdown table is printed last and written with the JSON to --out-dir (default $OUT, else a new temp folder).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch

from gpu_timing import copy_tbps, graph_ms, save_table
from records import out_dir
from gdn_export.ops.attention import DECODE_MIN_SLOTS, _attention_sdpa, _triton_kernel, attention

H, D = 16, 256
HEADS_KV = (2, 4)
STEPS = 20  # calls per graph (and the most cache sets a graph rotates over)


def _inputs(B, Hkv, L, visible, sets, dtype=torch.bfloat16):
    """`sets` cache sets (q, key, value, mask), each query reading the first `visible` slots."""
    mask = (torch.arange(L, device="cuda") < visible)[None, None, None, :].expand(B, 1, 1, L).contiguous()
    out = []
    for _ in range(sets):
        q = torch.randn(B, H, 1, D, device="cuda", dtype=dtype)
        key = torch.randn(B, Hkv, L, D, device="cuda", dtype=dtype)
        value = torch.randn(B, Hkv, L, D, device="cuda", dtype=dtype)
        out.append((q, key, value, mask))
    return out


def _l2_bytes() -> int:
    return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)


def check_correctness() -> list[str]:
    """Both routes against fp32 SDPA on the same inputs; returns failure lines."""
    failures = []
    for Hkv in HEADS_KV:
        for B, L, visible in ((3, 4128, 4128), (2, 32800, 1000)):
            ((q, key, value, mask),) = _inputs(B, Hkv, L, visible, 1)
            want = torch.nn.functional.scaled_dot_product_attention(
                q.float(), key.float(), value.float(), attn_mask=mask, scale=D ** -0.5, enable_gqa=True)
            for name, fn in (("op", attention), ("sdpa", _attention_sdpa)):
                got = fn(q, key, value, mask, D ** -0.5).float()
                err = ((got - want).norm() / want.norm()).item()
                ok = err < 1e-2
                print(f"check {name:4s} Hkv={Hkv} B={B} L={L}: relative RMS {err:.2e} {'ok' if ok else 'FAIL'}")
                if not ok:
                    failures.append(f"{name} Hkv={Hkv} B={B} L={L}: {err:.2e}")
    return failures


def bench(batches, lengths, visible_frac, bw, rows):
    kernel = _triton_kernel("attention_decode")
    scale = D ** -0.5
    for Hkv in HEADS_KV:
        for L in lengths:
            for B in batches:
                visible = max(1, round(visible_frac * L))
                per_set = 2 * B * Hkv * L * D * 2  # K + V, bf16
                sets = min(STEPS, max(1, math.ceil(4 * _l2_bytes() / per_set)))
                data = _inputs(B, Hkv, L, visible, sets)
                moved = 2 * B * Hkv * visible * D * 2  # K + V of the visible slots, read once
                split = kernel is not None and L >= DECODE_MIN_SLOTS and kernel.supports(*data[0])
                n_splits = kernel.plan(*data[0][:2])[4] if split else 0
                t = {}
                for impl, fn in (("split-KV op", attention), ("SDPA route", _attention_sdpa)):
                    calls = iter(range(10**9))

                    def run(fn=fn, calls=calls):
                        q, key, value, mask = data[next(calls) % sets]  # the graph records each set
                        fn(q, key, value, mask, scale)

                    t[impl] = graph_ms(run, STEPS)
                for impl, ms in t.items():
                    rows.append(dict(Hkv=Hkv, B=B, L=L, visible=visible, impl=impl, us=ms * 1e3, bytes=moved,
                                     pct_copy=moved / (ms * 1e-3) / 1e12 / bw, sets=sets,
                                     n_splits=n_splits if impl == "split-KV op" else 0, kernel_taken=split))
                print(f"Hkv={Hkv} L={L:5d} B={B:2d} ({sets} sets, {n_splits} splits): "
                      + ", ".join(f"{i} {m * 1e3:.2f} us" for i, m in t.items()), flush=True)
                torch.cuda.empty_cache()


def markdown(rows, bw, visible_frac) -> str:
    lines = [f"{torch.cuda.get_device_name()}, copy bandwidth {bw:.2f} TB/s (read + write); H {H}, D {D}, "
             f"S = 1, bf16, {visible_frac:.0%} of the slots visible. us per call (CUDA graph replay) and % "
             f"of copy bandwidth for K + V read once.", "",
             "| Hkv | L | B | K+V MB | splits | split-KV op | SDPA route | speedup |",
             "|---|---|---|---|---|---|---|---|"]
    for Hkv in sorted({r["Hkv"] for r in rows}):
        for L in sorted({r["L"] for r in rows}):
            for B in sorted({r["B"] for r in rows}):
                cell = {r["impl"]: r for r in rows if (r["Hkv"], r["L"], r["B"]) == (Hkv, L, B)}
                if len(cell) < 2:
                    continue
                a, b = cell["split-KV op"], cell["SDPA route"]
                lines.append(f"| {Hkv} | {L} | {B} | {a['bytes'] / 1e6:.1f} | {a['n_splits'] or '-'} | "
                             f"{a['us']:.2f} ({a['pct_copy']:.0%}) | {b['us']:.2f} ({b['pct_copy']:.0%}) | "
                             f"{b['us'] / a['us']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="B = 1, 32 and L = 4128 only")
    ap.add_argument("--visible", type=float, default=1.0, help="fraction of the slots every query may read")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    args.out_dir = out_dir(args.out_dir, "attention_decode_bench")
    if not torch.cuda.is_available():
        print("attention_decode_bench needs a CUDA GPU")
        return 1
    torch.manual_seed(0)
    failures = check_correctness()
    if failures:
        print("correctness check failed:\n  " + "\n  ".join(failures))
        return 1
    bw = copy_tbps()
    rows: list[dict] = []
    bench((1, 32) if args.quick else (1, 8, 32), (4128,) if args.quick else (4128, 32800), args.visible, bw, rows)
    table = markdown(rows, bw, args.visible)
    save_table(args.out_dir, "attention_decode_bench", dict(copy_tbps=bw, rows=rows), table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
