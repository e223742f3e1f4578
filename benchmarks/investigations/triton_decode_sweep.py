"""Launch configurations of the Triton decode kernel (fused_recurrent_fwd, T = 1) per state dtype (H200).

    PYTHONPATH=$PWD python3 benchmarks/investigations/triton_decode_sweep.py [--out-dir DIR]

Hk 16, Hv 32, Dk = Dv = 128, bf16 activations, L2-normalised q / k, in place. For each state dtype
(fp32, bf16) and B in {8, 64, 256}: value columns per program (BV 16..128) x warps (1..8), each
captured in a CUDA graph whose steps rotate over copies of the state past L2 (as
state_dtype_bench.py), us and % of copy bandwidth; the default configuration is marked. A check of
every configuration against the float64 recurrent reference at B = 3 runs first.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/gpu_timing.py
from gpu_timing import copy_tbps, graph_ms, save_table  # noqa: E402
from records import out_dir  # noqa: E402
from gdn_export.ops.gated_delta_rule.naive import recurrent_gated_delta_rule
from kernels.gated_delta_rule.triton.fused_recurrent import fused_recurrent_gated_delta_rule

HK, HV, D = 16, 32, 128
STATES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CONFIGS = [(bv, w) for bv in (16, 32, 64, 128) for w in (1, 2, 4, 8) if bv * 128 // (w * 32) <= 256]
ROTATE_BYTES = 256 * 2**20


def _inputs(B, sd):
    q = torch.randn(B, 1, HK, D, device="cuda", dtype=torch.bfloat16)
    k = F.silu(torch.randn(B, 1, HK, D, device="cuda") + 4 * torch.randn(1, 1, HK, D, device="cuda")).bfloat16()
    v = torch.randn(B, 1, HV, D, device="cuda", dtype=torch.bfloat16)
    g = -F.softplus(torch.randn(B, 1, HV, device="cuda")) * 0.1
    beta = torch.sigmoid(torch.randn(B, 1, HV, device="cuda")).bfloat16()
    s0 = (torch.randn(B, HV, D, D, device="cuda") * 0.1).to(sd)
    return q, k, v, g, beta, s0


def check() -> list[str]:
    bad = []
    for name, sd in STATES.items():
        q, k, v, g, beta, s0 = _inputs(3, sd)
        ro, rs = recurrent_gated_delta_rule(q, k, v, g, beta, s0, use_qk_l2norm=True)
        for bv, w in CONFIGS:
            s = s0.clone()
            o = torch.full_like(v, float("nan"))
            fused_recurrent_gated_delta_rule(q, k, v, g, beta, s, use_qk_l2norm=True, inplace=True, out=o,
                                             block_v=bv, num_warps=w)
            eo = ((o.double() - ro.double()).norm() / ro.double().norm()).item()
            es = ((s.double() - rs.double()).norm() / rs.double().norm()).item()
            if not (eo < 2e-2 and es < 2e-2):
                bad.append(f"{name} BV={bv} warps={w}: o {eo:.2e} state {es:.2e}")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    args.out_dir = out_dir(args.out_dir, "triton_decode_sweep")
    if not torch.cuda.is_available():
        print("triton_decode_sweep needs a CUDA GPU")
        return 1
    torch.manual_seed(0)
    bad = check()
    if bad:
        print("correctness check failed:\n  " + "\n  ".join(bad))
        return 1
    bw = copy_tbps()
    rows = []
    for name, sd in STATES.items():
        for B in (8, 64, 256):
            q, k, v, g, beta, s0 = _inputs(B, sd)
            sets = max(1, min(64, -(-ROTATE_BYTES // s0.nbytes)))
            states = [s0.clone() for _ in range(sets)]
            o = torch.empty_like(v)
            moved = 2 * s0.nbytes + 2 * (q.nbytes + k.nbytes + v.nbytes) + B * HV * 6
            for bv, w in CONFIGS:
                calls = itertools.count()

                def run(bv=bv, w=w, calls=calls):
                    fused_recurrent_gated_delta_rule(q, k, v, g, beta, states[next(calls) % sets],
                                                     use_qk_l2norm=True, inplace=True, out=o, block_v=bv,
                                                     num_warps=w)
                us = graph_ms(run, max(20, sets)) * 1e3
                rows.append(dict(state=name, B=B, BV=bv, warps=w, us=us, pct=moved / (us * 1e-6) / 1e12 / bw))
            states.clear()
            torch.cuda.empty_cache()
    lines = [f"{torch.cuda.get_device_name()}, copy {bw:.2f} TB/s; us per decode step (% of copy bandwidth)", "",
             "| state | BV x warps | B=8 | B=64 | B=256 |", "|---|---|---|---|---|"]
    for name in STATES:
        for bv, w in CONFIGS:
            cells = [r for r in rows if (r["state"], r["BV"], r["warps"]) == (name, bv, w)]
            lines.append(f"| {name} | {bv} x {w} | " + " | ".join(f"{r['us']:.2f} ({r['pct']:.0%})" for r in cells)
                         + " |")
    save_table(args.out_dir, "triton_decode_sweep", dict(copy_tbps=bw, rows=rows), "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
