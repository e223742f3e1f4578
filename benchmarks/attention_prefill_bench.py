"""Prefill attention (many query rows against the static K/V cache) on a GPU: the op's Triton
prefill kernel vs its SDPA route, with PyTorch's flash kernel on the new keys alone as the floor (H200).

    PYTHONPATH=$PWD python3 benchmarks/attention_prefill_bench.py [--graph] [--out-dir DIR]

Shapes of the 1.66B model (H 16, Hkv 2, D 256, bf16) and of a D = 128 model (H 16, Hkv 4): one
4096-token prompt from empty caches (L = 4128 slots), a 1024-token chunk at past 3072 (chunked
prefill), and a batch of 4 ragged rows (pasts 0 / 100 / 700 / 2000, 1024 new tokens, L = 3104).
Every mask is causal over the written slots, as the model builds it (gdn_export.modules.kv_cache).
Implementations: the op `gdn_export.ops.attention.attention` (which takes kernels.attention.triton.prefill
at these shapes), its SDPA route `_attention_sdpa` (memory-efficient kernel, dense mask: the whole
S x L rectangle), and `flash (new keys)`: SDPA with is_causal on the new tokens' keys only, which
exists only when every row starts at past 0 (then it computes the same result): the speed a causal
flash kernel reaches here. Reports ms (median of do_bench over eager calls, host launch time
included where it exceeds the GPU's; with --graph, of CUDA-graph replays of 10 calls: GPU time, as
in a captured or compiled model) and TFLOP/s counting 4 * D flops per visible (query, slot) pair and
head. Checks the op against an fp32 reference first.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

from gpu_timing import graph_ms, median_ms, save_table
from records import out_dir
from gdn_export.ops.attention import _attention_sdpa, attention

CASES = [  # name, H, Hkv, D, pasts, S (new tokens per row), L
    ("prompt 4096", 16, 2, 256, (0,), 4096, 4128),
    ("chunk 1024 at 3072", 16, 2, 256, (3072,), 1024, 4128),
    ("4 ragged rows x 1024", 16, 2, 256, (0, 100, 700, 2000), 1024, 3104),
    ("prompt 4096, D 128", 16, 4, 128, (0,), 4096, 4128),
    ("8 rows x 512 from 0, D 128", 16, 4, 128, (0,) * 8, 512, 544),
]


def _inputs(H, Hkv, D, pasts, S, L, dtype=torch.bfloat16):
    B = len(pasts)
    past = torch.tensor(pasts, device="cuda")
    q = torch.randn(B, S, H, D, device="cuda", dtype=dtype).transpose(1, 2)  # a transposed view, as the model's
    key = torch.randn(B, Hkv, L, D, device="cuda", dtype=dtype)
    value = torch.randn(B, Hkv, L, D, device="cuda", dtype=dtype)
    q_pos = past[:, None] + torch.arange(S, device="cuda")  # [B, S]
    mask = (torch.arange(L, device="cuda")[None, None, :] <= q_pos[:, :, None])[:, None]  # [B, 1, S, L]
    return q, key, value, mask


def run_case(name, H, Hkv, D, pasts, S, L, graph=False):
    q, key, value, mask = _inputs(H, Hkv, D, pasts, S, L)
    scale = D ** -0.5
    want = F.scaled_dot_product_attention(q.float(), key.float(), value.float(), attn_mask=mask, scale=scale,
                                          enable_gqa=True)
    got = attention(q, key, value, mask, scale).float()
    err = ((got - want).norm() / want.norm()).item()
    del want, got
    flops = 4 * D * H * mask.sum().item()
    impls = {"op": lambda: attention(q, key, value, mask, scale),
             "SDPA route": lambda: _attention_sdpa(q, key, value, mask, scale)}
    if all(p == 0 for p in pasts):
        kn, vn = key[:, :, :S], value[:, :, :S]
        impls["flash (new keys)"] = lambda: F.scaled_dot_product_attention(q, kn, vn, is_causal=True, scale=scale,
                                                                           enable_gqa=True)
    ms = {k: graph_ms(fn, 10) if graph else median_ms(fn, warmup=5, rep=100) for k, fn in impls.items()}
    row = dict(case=name, H=H, Hkv=Hkv, D=D, pasts=list(pasts), S=S, L=L, rel_rms=err, ms=ms,
               tflops={k: flops / (v * 1e-3) / 1e12 for k, v in ms.items()})
    print(f"{name}: rel RMS {err:.2e}; " + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()), flush=True)
    return row


def markdown(rows, graph) -> str:
    lines = [f"{torch.cuda.get_device_name()}, bf16, causal masks over the written slots. ms (TFLOP/s), "
             f"{'CUDA-graph replays' if graph else 'eager calls'}.", "",
             "| case | H / Hkv / D | op | SDPA route | flash (new keys) | op vs SDPA route | op rel RMS |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        cell = {k: f"{r['ms'][k]:.3f} ({r['tflops'][k]:.0f})" for k in r["ms"]}
        lines.append(f"| {r['case']} | {r['H']} / {r['Hkv']} / {r['D']} | {cell['op']} | {cell['SDPA route']} | "
                     f"{cell.get('flash (new keys)', '-')} | {r['ms']['SDPA route'] / r['ms']['op']:.2f}x | "
                     f"{r['rel_rms']:.1e} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays (GPU time) instead of eager calls")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    args.out_dir = out_dir(args.out_dir, "attention_prefill_bench")
    if not torch.cuda.is_available():
        print("attention_prefill_bench needs a CUDA GPU")
        return 1
    torch.manual_seed(0)
    rows = []
    for case in CASES:
        rows.append(run_case(*case, graph=args.graph))
        torch.cuda.empty_cache()
    bad = [r["case"] for r in rows if not r["rel_rms"] < 1e-2]
    save_table(args.out_dir, "attention_prefill_bench", dict(rows=rows), markdown(rows, args.graph))
    if bad:
        print("correctness check failed (relative RMS >= 1e-2): " + ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
