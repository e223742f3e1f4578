"""Decode and prefill speed of the gated delta rule with an fp32 / bf16 / fp16 recurrent state (H200).

    PYTHONPATH=$PWD python3 benchmarks/state_dtype_bench.py [--quick]

Shapes: Hk 16, Hv 32, Dk = Dv = 128, bf16 activations, L2-normalised q and k. Per state dtype:
  * decode step (T = 1) for B = 1 .. 512, each implementation captured in a CUDA graph of 20 steps
    (or more) and the replay timed (median, triton.testing.do_bench); the steps of a replay rotate
    over copies of the state until they read 256 MB, so that no state is read from L2 (a model's
    other layers evict it between two steps of one layer; B = 32 fits the H200's L2 otherwise): our
    CUDA kernel through the bare extension launcher (in place), the public op
    `gdn_export.ops.gated_delta_rule` with the cuda and the triton backend (fresh state tensors, as
    a graph would run them), and FlashInfer's decode (`gated_delta_rule_decode_pretranspose`, bf16
    state only, when `import flashinfer` works); % of the device-to-device copy bandwidth measured
    in the same run, for the bytes the step moves (state read + write, q, k, v, o, g, beta);
  * prefill B = 1, T = 4096 and 16384 through the op (cuda, triton), do_bench median.
A correctness check against the reference (same storage dtype) runs first and stops the run on a
failure. The markdown table is printed last and written with the JSON to --out-dir (default $OUT, else a new temp folder).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch
import torch.nn.functional as F

from gdn_export.cuda import extension
from gpu_timing import copy_tbps, graph_ms, median_ms, save_table
from records import out_dir
from gdn_export.ops import gated_delta_rule, use_backend
from gdn_export.ops.gated_delta_rule.naive import chunked_gated_delta_rule, recurrent_gated_delta_rule

HK, HV, D = 16, 32, 128
STATES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
NAN = float("nan")


def _inputs(B, T, state_dtype, dtype=torch.bfloat16, correlated=False):
    q = torch.randn(B, T, HK, D, device="cuda", dtype=dtype)
    k = torch.randn(B, T, HK, D, device="cuda", dtype=dtype)
    if correlated:
        k = F.silu(k.float() + 4 * torch.randn(1, 1, HK, D, device="cuda")).to(dtype)
    v = torch.randn(B, T, HV, D, device="cuda", dtype=dtype)
    g = -F.softplus(torch.randn(B, T, HV, device="cuda")) * 0.1
    beta = torch.sigmoid(torch.randn(B, T, HV, device="cuda")).to(dtype)
    s0 = (torch.randn(B, HV, D, D, device="cuda") * 0.1).to(state_dtype)
    return q, k, v, g, beta, s0


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check_correctness() -> list[str]:
    """Every implementation vs the reference of the same storage dtype; returns failure lines."""
    failures = []
    for name, sd in STATES.items():
        for T in (1, 300):
            x = _inputs(4, T, sd, correlated=True)
            ref = (recurrent_gated_delta_rule if T == 1 else chunked_gated_delta_rule)(*x, use_qk_l2norm=True)
            for backend in ("cuda", "triton"):
                with use_backend(backend):
                    o, s = gated_delta_rule(*x, use_qk_l2norm=True)
                eo, es = _rel(o, ref[0]), _rel(s, ref[1])
                ok = s.dtype == sd and eo < 2e-2 and es < 2e-2
                print(f"check {backend:6s} state {name} T={T:4d}: o {eo:.2e} state {es:.2e} {'ok' if ok else 'FAIL'}")
                if not ok:
                    failures.append(f"{backend} state {name} T={T}: o {eo:.2e} state {es:.2e} dtype {s.dtype}")
    return failures


def _flashinfer_decode():
    try:
        from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose
    except Exception as exc:  # noqa: BLE001  (guarded: the column is skipped)
        print(f"flashinfer unavailable: {type(exc).__name__}: {exc}".splitlines()[0])
        return None
    return gated_delta_rule_decode_pretranspose


ROTATE_BYTES = 256 * 2**20  # states read per graph replay: well past the H200's 50 MB L2


def _rotating(make, count):
    """A function that calls make(i) for i = 0, 1, ..., count - 1, 0, ... on successive calls: a
    graph captured from it reads a different state set per step, as a model's layers do."""
    calls = itertools.count()
    return lambda: make(next(calls) % count)


def bench_decode(batches, bw, rows):
    fi = _flashinfer_decode()
    ext = extension.load()
    scale = D**-0.5
    for B in batches:
        for name, sd in STATES.items():
            q, k, v, g, beta, state = _inputs(B, 1, sd)
            es = torch.tensor([], dtype=sd).element_size()
            sets = max(1, min(256, -(-ROTATE_BYTES // state.nbytes)))
            states = [state] + [state.clone() for _ in range(sets - 1)]
            steps = max(20, sets)
            o = torch.empty_like(v)
            moved = 2 * B * HV * D * D * es + 2 * (2 * B * HK * D + 2 * B * HV * D) + B * HV * 6
            t = {}
            t["cuda kernel"] = graph_ms(_rotating(
                lambda i: ext.gated_delta_rule(q, k, v, g, beta, states[i], scale, True, None, o, states[i], 1),
                sets), steps)

            def op(backend):
                def run(i):
                    with use_backend(backend):
                        gated_delta_rule(q, k, v, g, beta, states[i], scale, True)
                return _rotating(run, sets)

            t["op cuda"] = graph_ms(op("cuda"), steps)
            t["op triton"] = graph_ms(op("triton"), steps)
            t["flashinfer"] = NAN
            if fi is not None and sd == torch.bfloat16:
                # FlashInfer takes the raw gates (a, b, A_log, dt_bias) and a V-major [B, HV, V, K] state.
                a = torch.randn(B, 1, HV, device="cuda", dtype=torch.bfloat16)
                bb = torch.randn(B, 1, HV, device="cuda", dtype=torch.bfloat16)
                A_log = torch.randn(HV, device="cuda") * 0.5
                dt_bias = torch.randn(HV, device="cuda")
                fstates = [s.transpose(-1, -2).contiguous() for s in states]
                out = torch.empty_like(v)
                try:
                    t["flashinfer"] = graph_ms(_rotating(
                        lambda i: fi(q, k, v, fstates[i], A_log, a, dt_bias, bb, scale=scale, output=out,
                                     use_qk_l2norm=True), sets), steps)
                except Exception as exc:  # noqa: BLE001
                    print(f"flashinfer decode failed at B={B}: {type(exc).__name__}: {exc}".splitlines()[0])
            for impl, ms in t.items():
                pct = moved / (ms * 1e-3) / 1e12 / bw if ms == ms else NAN
                rows.append(dict(kind="decode", B=B, T=1, state=name, impl=impl, us=ms * 1e3,
                                 bytes=moved, pct_copy=pct, state_sets=sets))
            print(f"decode B={B:3d} state {name} ({sets} state sets): "
                  + ", ".join(f"{i} {m * 1e3:.2f} us" for i, m in t.items()), flush=True)


def bench_prefill(lengths, rows):
    for T in lengths:
        for name, sd in STATES.items():
            x = _inputs(1, T, sd)
            for backend in ("cuda", "triton"):
                def run():
                    with use_backend(backend):
                        gated_delta_rule(*x, use_qk_l2norm=True)
                ms = median_ms(run, warmup=5, rep=100)
                rows.append(dict(kind="prefill", B=1, T=T, state=name, impl=f"op {backend}", us=ms * 1e3,
                                 bytes=NAN, pct_copy=NAN))
                print(f"prefill T={T} state {name} {backend}: {ms:.3f} ms", flush=True)


def markdown(rows, bw) -> str:
    impls = ["cuda kernel", "op cuda", "op triton", "flashinfer"]
    lines = [f"{torch.cuda.get_device_name()}, copy bandwidth {bw:.2f} TB/s (read + write); Hk {HK} Hv {HV} "
             f"D {D}, bf16 activations. Decode: us per step (CUDA graph replay, states rotated past L2) and % of "
             "copy bandwidth.", "",
             "| B | state | " + " | ".join(impls) + " |", "|---|---|" + "---|" * len(impls)]
    dec = [r for r in rows if r["kind"] == "decode"]
    for B in sorted({r["B"] for r in dec}):
        for name in STATES:
            cells = []
            for impl in impls:
                r = next((r for r in dec if r["B"] == B and r["state"] == name and r["impl"] == impl), None)
                ok = r is not None and r["us"] == r["us"]
                cells.append(f"{r['us']:.2f} ({r['pct_copy']:.0%})" if ok else "-")
            lines.append(f"| {B} | {name} | " + " | ".join(cells) + " |")
    pre = [r for r in rows if r["kind"] == "prefill"]
    if pre:
        lines += ["", "Prefill B = 1, ms (do_bench median):", "", "| T | state | op cuda | op triton |",
                  "|---|---|---|---|"]
        for T in sorted({r["T"] for r in pre}):
            for name in STATES:
                cell = {r["impl"]: r["us"] / 1e3 for r in pre if r["T"] == T and r["state"] == name}
                lines.append(f"| {T} | {name} | {cell.get('op cuda', NAN):.3f} | {cell.get('op triton', NAN):.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="B = 1, 64, 256 and T = 4096 only")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    args.out_dir = out_dir(args.out_dir, "state_dtype_bench")
    torch.manual_seed(0)
    failures = check_correctness()
    if failures:
        print("correctness check failed:\n  " + "\n  ".join(failures))
        return 1
    bw = copy_tbps()
    rows: list[dict] = []
    bench_decode((1, 64, 256) if args.quick else (1, 2, 4, 8, 32, 64, 128, 256, 512), bw, rows)
    bench_prefill((4096,) if args.quick else (4096, 16384), rows)
    table = markdown(rows, bw)
    save_table(args.out_dir, "state_dtype_bench", dict(copy_tbps=bw, rows=rows), table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
