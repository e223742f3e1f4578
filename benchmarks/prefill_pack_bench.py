"""Prefill of batches and packs through the public op: batched [B, T] vs the same tokens packed with
cu_seqlens, ours (triton, cuda) beside FLA 0.6 and FlashInfer 0.7 (when importable), H200.

    PYTHONPATH=$PWD python3 benchmarks/prefill_pack_bench.py [--out-dir DIR] [--quick]
                                            [--backends triton,cuda] [--no-flashinfer] [--no-fla]
                                            [--cases NAME,...]

Shapes: bf16, Dk = Dv = 128, correlated SiLU keys, slow decay, fp32 initial state, L2 norm of q / k in
the kernel. Classes (issue 13): one long sequence, equal-length batches with grouped value heads, many
short sequences, a ragged pack (1 to 12000 tokens). Batched cases run twice, as [B, T] and as one
cu_seqlens pack of the same tokens, so the table shows what packing costs each implementation. Times
are do_bench medians (ms) of the public op `gdn_export.ops.gated_delta_rule` (ours), FLA's
`chunk_gated_delta_rule` and FlashInfer's `gdn_prefill.chunk_gated_delta_rule` (packed only: it takes
packed tokens); the last columns are FLA's time over ours. The markdown table is printed last and
written with the JSON to --out-dir (default $OUT, else a new temp folder).

Besides the op backends, --backends takes `cuda-wmma`, `cuda-walk1`, `cuda-walk2`, `cuda-walk4`: the
cuda backend called directly with the chunked path's sequential pass pinned (the wmma walk, or the
mma.sync walk on 1 / 2 / 4 warps a block), and `triton-two-pass`, `triton-fused`: the triton backend
with the chunked kernels' form pinned (kernels/gated_delta_rule/triton/chunk.py FORMS), to compare
them in one run.

--accuracy adds, per implementation, the relative RMS of o (packed layout) against an fp32
reference: gdn_export.ops.gated_delta_rule.naive's chunked form in fp32 on the same inputs.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from gpu_timing import median_ms, save_table
from records import out_dir
from gdn_export.ops import gated_delta_rule, use_backend

D = 128
# name, Hk, Hv, sequence lengths, whether the lengths can also run as one [B, T] batch
CASES = [
    ("1 x 16K, Hv = 2Hk", 16, 32, [16384], True),
    ("1 x 64K, Hv = 2Hk", 16, 32, [65536], True),
    ("8 x 8K, Hv = 3Hk", 16, 48, [8192] * 8, True),
    ("8 x 8K, Hv = Hk", 16, 16, [8192] * 8, True),
    ("4 x 1000, Hv = 2Hk", 16, 32, [1000] * 4, True),
    ("32 x 512, Hv = 4Hk", 8, 32, [512] * 32, True),
    ("ragged 7 (1..12000), Hv = 2Hk", 16, 32, [1, 300, 12000, 64, 4097, 2500, 777], False),
]
QUICK = {"1 x 16K, Hv = 2Hk", "8 x 8K, Hv = 3Hk", "ragged 7 (1..12000), Hv = 2Hk"}


def _tokens(total, hk, hv, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    q = rnd(1, total, hk, D).bfloat16()
    k = F.silu(rnd(1, total, hk, D) + 2 * rnd(1, 1, hk, D)).bfloat16()
    v = rnd(1, total, hv, D).bfloat16()
    g = -F.softplus(rnd(1, total, hv) - 4)                  # slow decay
    beta = torch.sigmoid(rnd(1, total, hv) + 1).bfloat16()
    return q, k, v, g, beta


def _fla():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as exc:  # noqa: BLE001  (the column is skipped)
        print(f"fla unavailable: {type(exc).__name__}: {exc}".splitlines()[0])
        return None
    return chunk_gated_delta_rule


def _flashinfer():
    try:
        from flashinfer.gdn_prefill import chunk_gated_delta_rule
    except Exception as exc:  # noqa: BLE001
        print(f"flashinfer unavailable: {type(exc).__name__}: {exc}".splitlines()[0])
        return None
    return chunk_gated_delta_rule


def _time(fn):
    try:
        fn()
        torch.cuda.synchronize()
        return median_ms(fn, warmup=10, rep=100)
    except Exception as exc:  # noqa: BLE001  (one failing implementation leaves a gap, not a crash)
        print(f"  failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
        torch.cuda.synchronize()
        return float("nan")


def _pinned_triton(form):
    """The triton backend through the public op with the chunked kernels' form pinned."""
    from kernels.gated_delta_rule.triton import chunk

    def run(q, k, v, g, beta, s0, cu):
        saved, chunk.FORM = chunk.FORM, form
        try:
            with use_backend("triton"):
                return gated_delta_rule(q, k, v, g, beta, s0, None, True, cu)
        finally:
            chunk.FORM = saved
    return run


def _reference(q, k, v, g, beta, s0, cu):
    """o of the fp32 naive chunked form (an independent reference; float64 would take minutes)."""
    from gdn_export.ops.gated_delta_rule import naive

    return naive.chunked_gated_delta_rule(q.float(), k.float(), v.float(), g.float(), beta.float(), s0,
                                          q.shape[-1] ** -0.5, True, cu)[0]


def _rel_rms(a, b):
    a, b = a.float().flatten(), b.float().flatten()
    return ((a - b).norm() / b.norm()).item()


def _pinned_cuda(backend):
    """The cuda backend with the chunked path's sequential pass pinned (`cuda-wmma`, `cuda-walkN`)."""
    from gdn_export.ops.gated_delta_rule import cuda as cuda_backend
    walk = backend.removeprefix("cuda-")
    path = cuda_backend.PATH_CHUNKED_WMMA if walk == "wmma" else cuda_backend.PATH_CHUNKED_WALK[int(walk[4:])]

    def run(q, k, v, g, beta, s0, cu):
        return cuda_backend.gated_delta_rule(q, k, v, g, beta, s0, q.shape[-1] ** -0.5, True, cu, path=path)
    return run


def _runner(backend):
    if backend.startswith("cuda-"):
        return _pinned_cuda(backend)
    if backend.startswith("triton-"):
        return _pinned_triton(backend.removeprefix("triton-"))

    def run(q, k, v, g, beta, s0, cu):
        with use_backend(backend):
            return gated_delta_rule(q, k, v, g, beta, s0, None, True, cu)
    return run


def run_case(name, hk, hv, lens, batchable, fla, fi, backends=("triton", "cuda"), accuracy=False):
    total = sum(lens)
    q, k, v, g, beta = _tokens(total, hk, hv)
    n = len(lens)
    s0 = torch.randn(n, hv, D, D, device="cuda") * 0.1
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    row = dict(case=name, tokens=total)
    layouts = [("packed", (q, k, v, g, beta), cu)]
    if batchable:
        B, T = n, lens[0]
        layouts.append(("batched", tuple(x.reshape(B, T, *x.shape[2:]) for x in (q, k, v, g, beta)), None))
    for layout, (qq, kk, vv, gg, bb), cus in layouts:
        for backend in backends:
            def ours(run=_runner(backend), qq=qq, kk=kk, vv=vv, gg=gg, bb=bb, cus=cus):
                return run(qq, kk, vv, gg, bb, s0, cus)
            row[f"{backend} {layout}"] = _time(ours)
            if accuracy and layout == "packed":
                want = _reference(q, k, v, g, beta, s0, cu) if "ref" not in row else row["ref"]
                row["ref"] = want
                try:
                    row[f"{backend} rms"] = _rel_rms(ours()[0], want)
                except Exception as exc:  # noqa: BLE001
                    print(f"  {backend}: accuracy failed: {type(exc).__name__}")
        if fla is not None:
            row[f"fla {layout}"] = _time(lambda qq=qq, kk=kk, vv=vv, gg=gg, bb=bb, cus=cus: fla(
                qq, kk, vv, gg, bb, initial_state=s0, output_final_state=True, cu_seqlens=cus,
                use_qk_l2norm_in_kernel=True))
    if fi is not None:
        # FlashInfer: packed [T, H, D] tokens, alpha = exp(g) and beta in fp32, int64 cu_seqlens
        alpha, beta32, cu64 = g[0].exp(), beta[0].float(), cu.to(torch.int64)
        row["flashinfer packed"] = _time(lambda: fi(
            q[0], k[0], v[0], alpha, beta32, None, s0, True, cu64, True))
        if accuracy and "ref" in row:
            try:
                row["flashinfer rms"] = _rel_rms(fi(q[0], k[0], v[0], alpha, beta32, None, s0, True, cu64, True)[0],
                                                 row["ref"][0])
            except Exception as exc:  # noqa: BLE001
                print(f"  flashinfer: accuracy failed: {type(exc).__name__}")
    if fla is not None and accuracy and "ref" in row:
        row["fla rms"] = _rel_rms(fla(q, k, v, g, beta, initial_state=s0, output_final_state=True, cu_seqlens=cu,
                                      use_qk_l2norm_in_kernel=True)[0], row["ref"])
    row.pop("ref", None)
    for impl in (*backends, "flashinfer"):
        for layout in ("packed", "batched"):
            ours, ref = row.get(f"{impl} {layout}"), row.get(f"fla {layout}")
            if ours is not None and ref is not None and ours == ours and ref == ref:
                row[f"fla/{impl} {layout}"] = ref / ours
    print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items() if isinstance(v, float)), flush=True)
    return row


def markdown(rows, backends=("triton", "cuda")) -> str:
    impls = (*backends, "fla", "flashinfer")
    times = [f"{i} {layout}" for i in impls for layout in ("batched", "packed")]
    ratios = [f"fla/{i} {layout}" for i in (*backends, "flashinfer") for layout in ("batched", "packed")]
    rms = [f"{i} rms" for i in impls]
    cols = [c for c in times + ratios + rms if any(c in r for r in rows)]
    lines = [f"{torch.cuda.get_device_name()}, bf16, Dk = Dv = 128; ms (do_bench median) and FLA / ours "
             "(> 1: ours faster)", "", "| case | tokens | " + " | ".join(cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            x = r.get(c)
            cells.append("-" if x is None or x != x else
                         (f"{x:.2f}x" if "/" in c else f"{x:.1e}" if c.endswith("rms") else f"{x:.3f}"))
        lines.append(f"| {r['case']} | {r['tokens']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--quick", action="store_true", help="three cases: 16K, 8 x 8K, the ragged pack")
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--backends", default="triton,cuda",
                    help="our op backends to time (comma-separated; also cuda-wmma, cuda-walk1/2/4)")
    ap.add_argument("--cases", default=None, help="comma-separated case numbers (1-based) to run")
    ap.add_argument("--accuracy", action="store_true", help="relative RMS of o against the fp32 naive reference")
    args = ap.parse_args(argv)
    args.out_dir = out_dir(args.out_dir, "prefill_pack_bench")
    fla = None if args.no_fla else _fla()
    fi = None if args.no_flashinfer else _flashinfer()
    backends = args.backends.split(",")
    picked = None if args.cases is None else {int(c) for c in args.cases.split(",")}
    cases = [c for i, c in enumerate(CASES, 1)
             if (picked is None or i in picked) and (not args.quick or c[0] in QUICK)]
    rows = []
    for c in cases:
        rows.append(run_case(*c, fla, fi, backends, args.accuracy))
        save_table(args.out_dir, "prefill_pack_bench", rows, markdown(rows, backends))  # partial results survive
    table = markdown(rows, backends)
    save_table(args.out_dir, "prefill_pack_bench", rows, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
