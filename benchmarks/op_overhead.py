"""Host overhead of one decode call through the public op, and whether it captures in a CUDA graph.

    python benchmarks/op_overhead.py [--batch 1] [--calls 2000] [--out DIR]

One decode step (T = 1, Hk 16, Hv 32, Dk = Dv = 128, bf16, fp32 state, batch 1: a kernel of a few
microseconds, so back-to-back eager calls are bound by the host) through:
`gdn_export.ops.gated_delta_rule` and the in-place `gated_delta_rule_` (the model's decode call) on
the triton and cuda backends, each backend's (checked) entry point without the op wrapper, the
cuda extension called alone (the floor of the op's fast entry), and FLA's
fused_recurrent when it imports. Per call: eager wall time (median of 7 runs of `calls` calls, one
sync each), the same calls replayed from a CUDA graph (device time: the graph captures the op), and
host overhead = eager - graph. Writes op_overhead.md / .json under --out (default $OUT,
else a new temp folder); the table is printed last.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gpu_timing import save_table
from records import out_dir


def per_call_us(fn, calls: int) -> float:
    def once():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / calls * 1e6

    once()
    return statistics.median(once() for _ in range(7))


def graph_us(fn) -> float | str:
    """Per-call device time of 200 captured calls replayed as one graph; a string when the capture
    fails (the op must be capturable)."""
    from gpu_timing import graph_ms

    try:
        return graph_ms(fn, steps=200) * 1e3
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return f"capture failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    args.out = out_dir(args.out, "op_overhead")

    from gdn_export.ops import backends, gated_delta_rule, use_backend
    from gdn_export.ops.gated_delta_rule import gated_delta_rule_

    B, Hk, Hv, D = args.batch, 16, 32, 128
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen, device="cuda").to(dtype)

    q, k, v = rnd(B, 1, Hk, D), rnd(B, 1, Hk, D), rnd(B, 1, Hv, D)
    g = -torch.rand(B, 1, Hv, generator=gen, device="cuda") * 0.1
    beta = torch.rand(B, 1, Hv, generator=gen, device="cuda").to(torch.bfloat16)
    state = rnd(B, Hv, D, D, dtype=torch.float32) * 0.1
    scale = D ** -0.5
    cases = []
    for name in ("triton", "cuda"):
        try:
            backend = backends.get(name)
        except Exception as exc:  # noqa: BLE001 - the cuda extension may not build here
            print(f"{name}: not available ({exc})")
            continue

        def op():
            return gated_delta_rule(q, k, v, g, beta, state, use_qk_l2norm=True)

        def op_inplace():
            return gated_delta_rule_(q, k, v, g, beta, state, use_qk_l2norm=True)

        if name == "cuda":  # the floor: the compiled extension alone (its pybind call, checks, launch)
            from gdn_export.cuda.extension import load

            cases.append((name, "cuda: extension call alone", lambda: load().gated_delta_rule(
                q, k, v, g, beta, state, scale, True, None)))
        cases += [(name, f"{name}: backend entry point", lambda b=backend: b.gated_delta_rule(
                      q, k, v, g, beta, state, scale, True, None)),
                  (name, f"{name}: public op gated_delta_rule", op),
                  (name, f"{name}: public op gated_delta_rule_ (in place)", op_inplace)]
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla

        cases.append((None, "FLA 0.6 fused_recurrent", lambda: fla(
            q, k, v, g=g, beta=beta, scale=scale, initial_state=state, output_final_state=True,
            use_qk_l2norm_in_kernel=True)))
    except ImportError as exc:
        print(f"FLA not timed: {exc}")

    rows = []
    from gdn_export.ops.gated_delta_rule import check_inputs

    for label, fn in (("host only: the op's input checks", lambda: check_inputs(q, k, v, g, beta, state, None)),
                      ("host only: eager-or-traced test", lambda: backends.can_call_directly(q, k, v, g, beta, state)),
                      ("host only: backend lookup", lambda: backends.for_device(v.device))):
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn()
        us = (time.perf_counter() - t0) / args.calls * 1e6
        rows.append({"call": label, "eager_us": us, "graph_us": "-", "host_overhead_us": us})
    for name, label, fn in cases:
        with use_backend(name or "reference"):  # the backend is chosen once, as a user does
            eager = per_call_us(fn, args.calls)
            graph = graph_us(fn)
        over = eager - graph if isinstance(graph, float) else None
        rows.append({"call": label, "eager_us": eager, "graph_us": graph, "host_overhead_us": over})
        print(f"{label}: eager {eager:.1f} us, graph {graph if isinstance(graph, str) else f'{graph:.1f} us'}",
              flush=True)
    lines = [f"# Decode op overhead: B={B}, Hk {Hk} / Hv {Hv}, D {D}, bf16, fp32 state "
             f"({torch.cuda.get_device_name()})", "",
             "| call | eager us/call | CUDA graph us/call | host overhead us |", "|---|---|---|---|"]
    for r in rows:
        gr = r["graph_us"] if isinstance(r["graph_us"], str) else f"{r['graph_us']:.1f}"
        ov = "-" if r["host_overhead_us"] is None else f"{r['host_overhead_us']:.1f}"
        lines.append(f"| {r['call']} | {r['eager_us']:.1f} | {gr} | {ov} |")
    save_table(args.out, "op_overhead", rows, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
