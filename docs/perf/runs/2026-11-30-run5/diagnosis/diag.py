"""Device experiment: correctness (vs fp32 reference) and per-kernel timing of one kernels dir.

    KDIR=... python diag.py check B T H D dtype [correlated] [stages]
    KDIR=... python diag.py time  B T [stages] [wy_warps] [bv]
"""
import os, sys, time
sys.path[:0] = [os.environ["KDIR"], os.getcwd()]
import torch
from tests.conftest import gdn_inputs, rel_rms
from gdn_kernels import chunk as C, wy as W
from gdn_kernels.utils import prepare_inputs

DT = dict(bf16=torch.bfloat16, fp16=torch.float16, fp32=torch.float32)


def run(x, scale, stages=None, wy_warps=4, bv=None, sync=False):
    q, k, v, g, beta, gates, scale, cu = prepare_inputs(x["q"], x["k"], x["v"], x["g"], x["beta"], None, scale, None)
    outs = W.chunk_wy_fwd(q, k, v, g, beta, scale, True, None, None, num_warps=wy_warps)
    if sync:
        torch.cuda.synchronize(); print("  wy ok", flush=True)
    h0 = x["initial_state"]
    kw = dict(num_stages=stages, block_v=bv)
    if len(outs) == 6:
        w, u, A, G, fq, fk = outs
        f = lambda: C.chunk_state_output_fwd(q, k, w, u, A, G, fq, fk, h0, None, **kw)
    else:
        w, u, A, G = outs
        f = lambda: C.chunk_state_output_fwd(q, k, w, u, A, G, h0, scale, True, None, **kw)
    o, ht = f()
    if sync:
        torch.cuda.synchronize(); print("  chunk ok", flush=True)
    return (q, k, v, g, beta, scale, h0, wy_warps), f, (o, ht)


def check(B, T, H, D, dt, corr=False, stages=None):
    from gdn_export.ops.gated_delta_rule.naive import chunked_gated_delta_rule
    x = gdn_inputs(B, T, H, H, D, D, dtype=DT[dt], correlated=corr)
    ref = chunked_gated_delta_rule(*(x[n].float() for n in ("q", "k", "v", "g", "beta")),
                                   initial_state=x["initial_state"].float(), scale=D ** -0.5, use_qk_l2norm=True)
    x = {n: t.cuda() for n, t in x.items()}
    _, _, (o, ht) = run(x, D ** -0.5, stages, sync=True)
    print(f"check B={B} T={T} H={H} D={D} {dt} corr={corr} stages={stages}: o {rel_rms(o.cpu(), ref[0]):.2e} "
          f"state {rel_rms(ht.cpu(), ref[1]):.2e}", flush=True)


def timing(B, T, stages=None, wy_warps=4, bv=None):
    import triton.testing
    H, D = 32, 128
    x = gdn_inputs(B, T, H, H, D, D, dtype=torch.bfloat16, seed=0)
    x = {n: t.cuda() for n, t in x.items()}
    (q, k, v, g, beta, scale, h0, nw), f, _ = run(x, D ** -0.5, stages, wy_warps, bv)
    bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    t_wy = bench(lambda: W.chunk_wy_fwd(q, k, v, g, beta, scale, True, None, None, num_warps=nw))
    t_ch = bench(f)
    t_all = bench(lambda: run(x, D ** -0.5, stages, wy_warps, bv))
    print(f"time B={B} T={T} stages={stages} wy_warps={wy_warps} bv={bv}: wy {t_wy:.3f} chunk {t_ch:.3f} "
          f"all {t_all:.3f} ms", flush=True)


if __name__ == "__main__" and sys.argv[1] in ("check", "time"):
    a = sys.argv[1:]
    if a[0] == "check":
        check(int(a[1]), int(a[2]), int(a[3]), int(a[4]), a[5], len(a) > 6 and a[6] == "1",
              int(a[7]) if len(a) > 7 and a[7] != "-" else None)
    else:
        conv = lambda s: None if s == "-" else int(s)
        timing(int(a[1]), int(a[2]), *(conv(s) for s in a[3:]))


def decode(Bs):
    import triton.testing
    from gdn_kernels.fused_recurrent import fused_recurrent_gated_delta_rule as fr
    bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    n = (1 << 30) // 4
    src = torch.randn(n, device="cuda"); dst = torch.empty_like(src)
    copy = 2 * n * 4 / bench(lambda: dst.copy_(src)) / 1e6
    H, D = 32, 128
    for B in Bs:
        x = gdn_inputs(B, 1, H, H, D, D, dtype=torch.bfloat16, seed=0)
        x = {n_: t.cuda() for n_, t in x.items()}
        h = x["initial_state"].contiguous()
        ms = bench(lambda: fr(x["q"], x["k"], x["v"], x["g"], x["beta"], h, use_qk_l2norm=True, inplace=True))
        nbytes = 2 * B * H * D * D * 4 + B * H * D * 2 * 4
        print(f"decode B={B}: {ms*1e3:.1f} us  {nbytes/ms/1e6/copy*100:.1f}% of copy ({copy:.0f} GB/s)", flush=True)


if __name__ == "__main__" and sys.argv[1] == "decode":
    decode([int(s) for s in sys.argv[2:]])


def torch_wy(q, k, v, g, beta, scale):
    """fp32 torch versions of wy.py's (raw-operand) outputs, [B, Hv, T, *] (Hk = Hv)."""
    B, T, H, D = k.shape
    C = 64
    pad = (-T) % C
    f = lambda x: x.float().transpose(1, 2)  # [B, H, T, D]
    q, k, v = f(q), f(k), f(v)
    g, beta = g.float().transpose(1, 2), beta.float().transpose(1, 2)
    rq, rk = torch.rsqrt((q * q).sum(-1) + 1e-6), torch.rsqrt((k * k).sum(-1) + 1e-6)
    P = lambda x: torch.nn.functional.pad(x, (0, 0, 0, pad)) if x.dim() == 4 else torch.nn.functional.pad(x, (0, pad))
    q, k, v, g, beta, rq, rk = map(P, (q, k, v, g, beta, rq, rk))
    n = (T + pad) // C
    R = lambda x: x.reshape(B, H, n, C, *x.shape[3:])
    q, k, v, g, beta, rq, rk = map(R, (q, k, v, g, beta, rq, rk))
    G = g.cumsum(-1)
    eye = torch.eye(C, device=k.device)
    low = torch.ones(C, C, dtype=torch.bool, device=k.device).tril(-1)
    lower = low | eye.bool()
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    kn, qn = k * rk[..., None], q * rq[..., None]
    A = (beta[..., :, None] * (kn @ kn.transpose(-1, -2)) * decay).masked_fill(~low, 0)
    X = torch.linalg.inv(eye + A)
    w = X @ (beta[..., None] * kn * G[..., None].exp())
    u = X @ (beta[..., None] * v)
    Aqk = scale * (qn @ kn.transpose(-1, -2)) * decay
    fq = scale * G.exp() * rq
    fk = (G[..., -1:] - G).exp() * rk
    U = lambda x: x.reshape(B, H, n * C, *x.shape[4:])[:, :, :T].contiguous()
    return [U(x) for x in (w, u, Aqk, G, fq, fk)]


def localise(B, T, H, D, dt, corr=False, stages=None, bv=None):
    """wy.py outputs vs torch_wy; chunk.py on torch_wy's intermediates vs the reference."""
    from gdn_export.ops.gated_delta_rule.naive import chunked_gated_delta_rule
    x = gdn_inputs(B, T, H, H, D, D, dtype=DT[dt], correlated=corr)
    ref = chunked_gated_delta_rule(*(x[n].float() for n in ("q", "k", "v", "g", "beta")),
                                   initial_state=x["initial_state"].float(), scale=D ** -0.5, use_qk_l2norm=True)
    x = {n: t.cuda() for n, t in x.items()}
    scale = D ** -0.5
    q, k, v, g, beta, gates, scale, cu = prepare_inputs(x["q"], x["k"], x["v"], x["g"], x["beta"], None, scale, None)
    outs = W.chunk_wy_fwd(q, k, v, g, beta, scale, True, None, None)
    torch.cuda.synchronize()
    tw = torch_wy(q, k, v, g, beta, scale)
    names = ("w", "u", "Aqk", "gcum", "fq", "fk")
    errs = " ".join(f"{n} {rel_rms(a.float(), b):.1e}" for n, a, b in zip(names, outs, tw))
    nan = [n for n, a in zip(names, outs) if torch.isnan(a).any() or torch.isinf(a).any()]
    print(f"localise {dt} B={B} T={T} D={D} corr={corr}: wy vs torch: {errs} nonfinite={nan}", flush=True)
    w = tw[0].to(q.dtype)
    o, ht = C.chunk_state_output_fwd(q, k, w, *tw[1:], x["initial_state"], None, num_stages=stages, block_v=bv)
    torch.cuda.synchronize()
    bad = torch.isnan(o).nonzero()
    print(f"   chunk on torch intermediates (stages={stages} bv={bv}): o {rel_rms(o.cpu(), ref[0]):.2e} "
          f"state {rel_rms(ht.cpu(), ref[1]):.2e} nan rows {bad[:, 1].unique().tolist()[:12] if len(bad) else []}"
          f" nan heads {bad[:, 2].unique().tolist()[:8] if len(bad) else []}", flush=True)


if __name__ == "__main__" and sys.argv[1] == "localise":
    a = sys.argv[2:]
    localise(int(a[0]), int(a[1]), int(a[2]), int(a[3]), a[4], a[5] == "1", None if a[6] == "-" else int(a[6]))


if __name__ == "__main__" and sys.argv[1] == "multi":
    # multi "B,T,H,D,dt,corr,stages" ...
    for spec in sys.argv[2:]:
        a = spec.split(",")
        t0 = time.time()
        try:
            localise(int(a[0]), int(a[1]), int(a[2]), int(a[3]), a[4], a[5] == "1", None if a[6] == "-" else int(a[6]),
                     int(a[7]) if len(a) > 7 else None)
        except Exception as exc:
            print(f"localise {spec}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        print(f"   ({time.time() - t0:.1f} s)", flush=True)


def check2(B, T, Hk, Hv, Dk, Dv, dt):
    """Main-code prefill (chunk_gated_delta_rule) with separate head counts / dims, synced per launch."""
    from gdn_export.ops.gated_delta_rule.naive import chunked_gated_delta_rule
    x = gdn_inputs(B, T, Hk, Hv, Dk, Dv, dtype=DT[dt])
    ref = chunked_gated_delta_rule(*(x[n].float() for n in ("q", "k", "v", "g", "beta")),
                                   initial_state=x["initial_state"].float(), scale=Dk ** -0.5, use_qk_l2norm=True)
    x = {n: t.cuda() for n, t in x.items()}
    q, k, v, g, beta, gates, scale, cu = prepare_inputs(x["q"], x["k"], x["v"], x["g"], x["beta"], None, Dk ** -0.5, None)
    wy = W.chunk_wy_fwd(q, k, v, g, beta, scale, True, None, None)
    torch.cuda.synchronize(); print("  wy ok", flush=True)
    o, ht = C.chunk_state_output_fwd(q, k, *wy, x["initial_state"], None)
    torch.cuda.synchronize(); print("  chunk ok", flush=True)
    print(f"check2 B={B} T={T} Hk={Hk} Hv={Hv} Dk={Dk} Dv={Dv} {dt}: o {rel_rms(o.cpu(), ref[0]):.2e} "
          f"state {rel_rms(ht.cpu(), ref[1]):.2e}", flush=True)


if __name__ == "__main__" and sys.argv[1] == "check2":
    a = sys.argv[2:]
    check2(*(int(s) for s in a[:6]), a[6])
