"""Time the gated delta rule and conv kernels: ours (triton) vs FLA vs the PyTorch reference.

    python benchmarks/bench_kernels.py --out DIR [--cuda] [--sweep] [--skip-fla]

Every time is the median of triton.testing.do_bench (L2 flushed between calls) on fresh non-zero
random inputs (bf16, Hk = Hv = 32, Dk = Dv = 128, q/k L2 norm in the kernel, initial and final
state). GB/s counts the minimum bytes (each input read once, o and the state written once) and
"% copy" relates it to a 1 GiB device-to-device copy timed in the same run (bytes read + written).
The reference is skipped where it would take too long (prefill T > 4096) and says "skipped".
Writes DIR/bench_kernels.md and DIR/bench_kernels.json; prints the markdown.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.join(ROOT, "kernels")):
    if p not in sys.path:
        sys.path.insert(0, p)

PREFILL = [(1, 4096), (1, 16384), (1, 65536), (8, 8192)]   # (B, T)
DECODE = [1, 8, 64, 256]                                    # B at T = 1
HK, HV, D = 32, 32, 128
REFERENCE_MAX_T = 4096


def bench(fn, smoke=False) -> float:
    """Median milliseconds of fn()."""
    if smoke:  # CPU check of the script itself (TRITON_INTERPRET=1): one timed call
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def copy_gbps(device, smoke) -> float:
    n = (1 << 30) // 4 if not smoke else 1 << 20
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src), smoke)
    return 2 * src.numel() * 4 / ms / 1e6


def gdn_case(B, T, device, dtype=torch.bfloat16, Hk=HK, Hv=HV, D=D, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device=device, generator=gen)  # noqa: E731
    x = dict(q=rnd(B, T, Hk, D).to(dtype), k=rnd(B, T, Hk, D).to(dtype), v=rnd(B, T, Hv, D).to(dtype),
             g=-torch.nn.functional.softplus(rnd(B, T, Hv)) * 0.5,
             beta=torch.sigmoid(rnd(B, T, Hv)).to(dtype),
             initial_state=rnd(B, Hv, D, D) * 0.1)
    es = torch.finfo(dtype).bits // 8
    nbytes = (B * T * (2 * Hk * D + 2 * Hv * D) * es + B * T * Hv * (4 + es)
              + 2 * B * Hv * D * D * 4)
    return x, nbytes


def rel_rms(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def implementations(args, decode):
    """name -> callable(x) -> (o, state) for every implementation that imports here."""
    from kernels.gated_delta_rule.triton.chunk import chunk_gated_delta_rule
    from kernels.gated_delta_rule.triton.fused_recurrent import fused_recurrent_gated_delta_rule
    from gdn_export.ops.gated_delta_rule.naive import chunked_gated_delta_rule, recurrent_gated_delta_rule

    impls, notes = {}, []
    scale = D ** -0.5
    if decode:
        impls["ours"] = lambda x: fused_recurrent_gated_delta_rule(
            **x, scale=scale, use_qk_l2norm=True, inplace=True)
    else:
        impls["ours"] = lambda x: chunk_gated_delta_rule(**x, scale=scale, use_qk_l2norm=True)
    if not args.skip_fla:
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
            from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_rec

            fla = fla_rec if decode else fla_chunk
            impls["fla"] = lambda x: fla(
                x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], scale=scale,
                initial_state=x["initial_state"], output_final_state=True, use_qk_l2norm_in_kernel=True)
        except ImportError as exc:
            notes.append(f"FLA not timed: {exc}")
    if args.cuda:
        try:
            from gdn_export.ops import backends

            cuda = backends.get("cuda").gated_delta_rule
            impls["cuda"] = lambda x: cuda(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                           x["initial_state"], scale, True, None)
        except Exception as exc:  # the cuda backend is optional here: say why it is missing
            notes.append(f"cuda backend not timed: {type(exc).__name__}: {exc}")
    ref = recurrent_gated_delta_rule if decode else chunked_gated_delta_rule
    impls["reference"] = lambda x: ref(**x, scale=scale, use_qk_l2norm=True)
    return impls, notes


def run_gdn(args, device, copy, rows, notes, save):
    prefill = [tuple(int(n) for n in c.split("x")) for c in args.prefill] if args.prefill else PREFILL
    for decode, cases in ((True, [(b, 1) for b in DECODE] if not args.no_decode else []), (False, prefill)):
        impls, n = implementations(args, decode)
        notes.extend(x for x in n if x not in notes)
        for B, T in cases:
            if args.smoke:
                B, T = min(B, 2), min(T, 70)
            x, nbytes = gdn_case(B, T, device, Hk=args.hk, Hv=args.hv, D=args.d)
            case = f"{'decode' if decode else 'prefill'} B={B} T={T}"
            outs = {}
            for name, fn in impls.items():
                if name == "reference" and T > REFERENCE_MAX_T:
                    rows.append(dict(case=case, impl=name, ms=None, note="skipped (too slow)"))
                    continue
                xi = dict(x, initial_state=x["initial_state"].clone())
                try:
                    outs[name] = fn(xi)[0]
                    ms = bench(lambda: fn(xi), args.smoke)
                except Exception as exc:
                    rows.append(dict(case=case, impl=name, ms=None, note=f"failed: {type(exc).__name__}: {exc}"[:200]))
                    continue
                gbps = nbytes / ms / 1e6
                rows.append(dict(case=case, impl=name, ms=ms, gbps=gbps, pct_copy=100 * gbps / copy, bytes=nbytes))
            if not decode:
                launches_apart(x, case, rows, args.smoke)
                if args.profile and (B, T) in PROFILE_CASES:
                    for name in ("ours", "fla", "cuda"):
                        if name in impls:
                            profile_kernels(impls[name], x, case, name, rows, args.smoke)
            base = outs.get("fla", outs.get("reference"))
            for r in rows:
                if r["case"] == case and r["impl"] in outs and base is not None:
                    r["rel_rms_vs_" + ("fla" if "fla" in outs else "reference")] = rel_rms(outs[r["impl"]].float(), base.float())
            del x, outs
            torch.cuda.empty_cache() if device == "cuda" else None
            save()


def profile_kernels(fn, x, case, name, rows, smoke, calls=10):
    """GPU time of each kernel that fn launches (torch.profiler, mean over calls), one row each."""
    if smoke:
        return
    from torch.profiler import ProfilerActivity, profile

    xi = dict(x, initial_state=x["initial_state"].clone())
    fn(xi)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(xi)
        torch.cuda.synchronize()
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us > 0:
            rows.append(dict(case=case, impl=f"profile {name}: {e.key[:70]}", ms=us / calls / 1e3,
                             note=f"{e.count // calls} launch(es) per call"))


def launches_apart(x, case, rows, smoke):
    """Our prefill's two launches timed apart (default launch parameters)."""
    from kernels.gated_delta_rule.triton.chunk import chunk_state_output_fwd
    from kernels.gated_delta_rule.triton.wy import chunk_wy_fwd

    q, k, v, g, beta, h0 = (x[n] for n in ("q", "k", "v", "g", "beta", "initial_state"))
    scale = q.shape[-1] ** -0.5
    ms = bench(lambda: chunk_wy_fwd(q, k, v, g, beta, scale, True), smoke)
    rows.append(dict(case=case, impl="ours: wy.py kernel alone", ms=ms))
    ms = bench(lambda: chunk_wy_fwd(q, k, v, g, beta, scale, True, num_warps=8), smoke)
    rows.append(dict(case=case, impl="ours: wy.py kernel alone, 8 warps", ms=ms))
    ms = bench(lambda: chunk_wy_fwd(q, k, v, g, beta, scale, True, block_v=32), smoke)
    rows.append(dict(case=case, impl="ours: wy.py kernel alone, w and u in BV=32 blocks", ms=ms))
    wy = chunk_wy_fwd(q, k, v, g, beta, scale, True)
    ms = bench(lambda: chunk_state_output_fwd(q, k, *wy, h0), smoke)
    rows.append(dict(case=case, impl="ours: chunk.py kernel alone", ms=ms))


PROFILE_CASES = [(1, 16384), (8, 8192)]   # one per regime: few sequences, many


def run_conv(args, device, copy, rows, save):
    from kernels.causal_conv1d.triton.conv import causal_conv1d
    from gdn_export.ops.causal_conv1d.naive import causal_conv1d as ref

    C, K = 8192, 4
    for B, T in ((1, 16384), (64, 1), (256, 1)):
        if args.smoke:
            B, T = min(B, 2), min(T, 70)
        x = torch.randn(B, T, C, device=device).to(torch.bfloat16)
        w, b = torch.randn(C, K, device=device).to(x.dtype), torch.randn(C, device=device).to(x.dtype)
        s = torch.randn(B, C, K - 1, device=device).to(x.dtype)
        nbytes = 2 * (2 * B * T * C + C * K + C + 2 * B * C * (K - 1))
        for name, fn in (("ours", lambda: causal_conv1d(x, w, b, s, True)), ("reference", lambda: ref(x, w, b, s, True))):
            ms = bench(fn, args.smoke)
            gbps = nbytes / ms / 1e6
            rows.append(dict(case=f"conv1d B={B} T={T} C={C} K={K}", impl=name, ms=ms, gbps=gbps,
                             pct_copy=100 * gbps / copy, bytes=nbytes))
        save()


# (BV, warps, stages) of the fused sequential kernel: sm_90 compile (Triton 3.6, bf16, D 128) spills
# 128 bytes at (32, 4, 3), 8 at (16, 4, 3), none at (32, 8, 3) / (16, 8, 3) (sm90_compile_report.py)
FUSED_SWEEP = ((32, 4, 3), (32, 4, 2), (16, 4, 3), (16, 4, 4), (32, 8, 3), (16, 8, 3), (64, 8, 2), (64, 8, 3))


def _variant(case, name, run, o_default, smoke) -> dict:
    """One launch variant's row: its time, and its o against the two-pass default's (a variant is only
    worth its time if it computes the same o: guards against miscompiles), or why it failed."""
    try:
        ms = bench(run, smoke)
    except Exception as exc:  # noqa: BLE001  (the row says it failed)
        return dict(case=case, impl=name, ms=None, note=f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
    return dict(case=case, impl=name, ms=ms, note=f"o vs the two-pass default: rel. RMS {rel_rms(run()[0], o_default):.1e}")


def run_sweep(args, device, rows, save):
    """Launch-parameter variants of the chunked path's two kernels and of decode (for tuning)."""
    from kernels.gated_delta_rule.triton.chunk import chunk_fused_fwd, chunk_state_output_fwd
    from kernels.gated_delta_rule.triton.fused_recurrent import fused_recurrent_fwd
    from kernels.gated_delta_rule.triton.wy import chunk_inverse_fwd, chunk_wy_fwd

    scale = D ** -0.5
    for B, T in ((1, 16384), (8, 8192)) if args.only != "sweep-decode" else ():
        if args.smoke:
            B, T = 1, 130
        x, _ = gdn_case(B, T, device, Hk=args.hk, Hv=args.hv, D=args.d)
        q, k, v, g, beta, h0 = (x[n] for n in ("q", "k", "v", "g", "beta", "initial_state"))
        for nw in (4, 8):
            ms = bench(lambda: chunk_wy_fwd(q, k, v, g, beta, scale, True, num_warps=nw), args.smoke)
            rows.append(dict(case=f"sweep wy B={B} T={T}", impl=f"warps={nw}", ms=ms))
        wy = chunk_wy_fwd(q, k, v, g, beta, scale, True)
        o_default = chunk_state_output_fwd(q, k, *wy, h0)[0]
        # kv: the state held [Dk, BV] (chunk.py KV_STATE): every product on wgmma at BV = 32 on sm_90
        for bv, nw, ns, kv in ((16, 4, 2, False), (32, 4, 1, False), (32, 4, 2, False), (32, 4, 3, False),
                               (32, 8, 2, False), (32, 8, 3, False), (64, 4, 2, False), (64, 8, 2, False),
                               (64, 8, 3, False), (32, 4, 2, True), (32, 4, 3, True), (64, 4, 2, True)):
            name = f"BV={bv} warps={nw} stages={ns}" + (" kv" if kv else "")
            run = lambda: chunk_state_output_fwd(q, k, *wy, h0, block_v=bv, num_warps=nw, num_stages=ns,  # noqa: E731
                                                 kv_state=kv)
            rows.append(_variant(f"sweep state B={B} T={T}", name, run, o_default, args.smoke))
        # the fused form (chunk.FORM "fused"): the inverse-only chunk-local kernel, then the sequential
        # kernel that forms k h, v_new and Aqk per chunk; its o is checked against the two-pass default's
        for nw in (4, 8):
            ms = bench(lambda: chunk_inverse_fwd(q, k, v, g, beta, scale, True, num_warps=nw), args.smoke)
            rows.append(dict(case=f"sweep inverse B={B} T={T}", impl=f"warps={nw}", ms=ms))
        inv = chunk_inverse_fwd(q, k, v, g, beta, scale, True)
        for bv, nw, ns in FUSED_SWEEP:
            run = lambda: chunk_fused_fwd(q, k, v, *inv, h0, block_v=bv, num_warps=nw, num_stages=ns)  # noqa: E731
            rows.append(_variant(f"sweep fused B={B} T={T}", f"BV={bv} warps={nw} stages={ns}", run, o_default,
                                 args.smoke))
        del x, wy, inv, o_default
        save()
    for B in (1, 64, 256) if not args.no_decode else ():
        if args.smoke:
            B = 2
        x, nbytes = gdn_case(B, 1, device, Hk=args.hk, Hv=args.hv, D=args.d)
        q, k, v, g, beta, h0 = (x[n] for n in ("q", "k", "v", "g", "beta", "initial_state"))
        for bv, nw in ((8, 1), (16, 2), (16, 4), (32, 2), (32, 4), (32, 8), (64, 4), (64, 8), (128, 8)):
            ms = bench(lambda: fused_recurrent_fwd(q, k, v, g, beta, h0, scale, True, final_state=h0,
                                                   block_v=bv, num_warps=nw), args.smoke)
            rows.append(dict(case=f"sweep decode B={B}", impl=f"BV={bv} warps={nw}", ms=ms,
                             gbps=nbytes / ms / 1e6))
        save()


def markdown(meta, rows, notes) -> str:
    lines = [f"# bench_kernels ({meta['date']})", "",
             f"- GPU: {meta['gpu']}", f"- command: `{meta['command']}`",
             f"- torch {meta['torch']}, triton {meta['triton']}, fla {meta['fla']}",
             f"- copy bandwidth (1 GiB D2D, read + write): {meta['copy_gbps']:.0f} GB/s",
             f"- shapes: bf16, Hk={meta['hk']}, Hv={meta['hv']}, Dk=Dv={meta['d']}, q/k L2 norm in kernel, "
             "initial + final state; decode = T 1 (ours in place)", ""]
    lines += [f"- {n}" for n in notes]
    lines += ["", "| case | impl | ms | GB/s | % copy | rel RMS vs FLA/ref | note |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = f"{r['ms']:.4f}" if r.get("ms") is not None else "-"
        gb = f"{r['gbps']:.0f}" if r.get("gbps") is not None else "-"
        pc = f"{r['pct_copy']:.0f}%" if r.get("pct_copy") is not None else "-"
        err = r.get("rel_rms_vs_fla", r.get("rel_rms_vs_reference"))
        err = f"{err:.2e}" if err is not None else "-"
        lines.append(f"| {r['case']} | {r['impl']} | {ms} | {gb} | {pc} | {err} | {r.get('note', '')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    global D
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for bench_kernels.md / .json")
    ap.add_argument("--cuda", action="store_true", help="also time the `cuda` backend")
    ap.add_argument("--sweep", action="store_true", help="also time launch-parameter variants")
    ap.add_argument("--skip-fla", action="store_true", help="do not time FLA")
    ap.add_argument("--profile", action="store_true",
                    help="also list per-kernel GPU times (torch.profiler) of each prefill at two cases")
    ap.add_argument("--only", choices=["all", "gdn", "conv", "sweep", "sweep-decode"], default="all",
                    help="one section only (sweep implies --sweep)")
    ap.add_argument("--prefill", nargs="+", metavar="BxT", help="prefill cases instead of the default four")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode cases (and the decode sweep)")
    ap.add_argument("--hk", type=int, default=HK)
    ap.add_argument("--hv", type=int, default=HV)
    ap.add_argument("--d", type=int, default=D)
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run under TRITON_INTERPRET=1 (checks the script)")
    args = ap.parse_args(argv)
    D = args.d
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    device = "cpu" if args.smoke else "cuda"
    import triton

    try:
        import fla
        fla_version = getattr(fla, "__version__", "?")
    except ImportError:
        fla_version = "not installed"
    copy = copy_gbps(device, args.smoke)
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)",
                command="python " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + (argv or sys.argv[1:])),
                torch=torch.__version__, triton=triton.__version__, fla=fla_version, copy_gbps=copy,
                hk=args.hk, hv=args.hv, d=args.d)
    rows, notes = [], []
    os.makedirs(args.out, exist_ok=True)

    def save():
        # after every case, so that a run cut short still leaves its table
        md = markdown(meta, rows, notes)
        data = json.dumps(dict(meta=meta, rows=rows, notes=notes), indent=1)
        for name, text in (("bench_kernels.md", md), ("bench_kernels.json", data)):
            tmp = os.path.join(args.out, name + ".tmp")
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, os.path.join(args.out, name))
        return md

    if args.only in ("all", "gdn"):
        run_gdn(args, device, copy, rows, notes, save)
    if args.only in ("all", "conv"):
        run_conv(args, device, copy, rows, save)
    if args.sweep or args.only in ("sweep", "sweep-decode"):
        run_sweep(args, device, rows, save)
    md = save()
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
