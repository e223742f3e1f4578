"""One call of a CUDA (plugin) kernel case, for a profiler to attach to (Nsight Compute).

    PYTHONPATH=$PWD ncu --clock-control none --set full --import-source yes \
        -k regex:Prepare --launch-skip 1 --launch-count 1 -o prep \
        python3 benchmarks/kernel_targets.py prefill-16k
    python3 benchmarks/ncu_summary.py prep.ncu-rep

Each case runs twice (a warm-up, then the call to profile: `--launch-skip 1`). Cases: prefill-16k
(1 x 16K, Hk 16 / Hv 32), prefill-8x8k (8 x 8K, Hk 16 / Hv 48), decode-b64 (one decode step, B = 64,
Hk 16 / Hv 32, bf16 state). bf16 activations, Dk = Dv = 128, model-like keys (prefill_pack_bench).
"""

from __future__ import annotations

import argparse
import sys

import torch

from prefill_pack_bench import _tokens

CASES = {"prefill-16k": (16, 32, 1, 16384), "prefill-8x8k": (16, 48, 8, 8192), "decode-b64": (16, 32, 64, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=sorted(CASES))
    args = ap.parse_args(argv)
    from gdn_export.ops.gated_delta_rule import cuda as cb
    hk, hv, B, T = CASES[args.case]
    q, k, v, g, beta = (x.reshape(B, T, *x.shape[2:]) for x in _tokens(B * T, hk, hv))
    state_dtype = torch.bfloat16 if T == 1 else torch.float32
    s0 = (torch.randn(B, hv, 128, 128, device="cuda") * 0.1).to(state_dtype)
    for _ in range(2):
        cb.gated_delta_rule(q, k, v, g, beta, s0, 128 ** -0.5, True, None)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
