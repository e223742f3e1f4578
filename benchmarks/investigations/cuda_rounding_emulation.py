"""CPU emulation of the CUDA chunked (WY) gated delta rule kernels, with a switch per rounding.

    python benchmarks/investigations/cuda_rounding_emulation.py

Follows kernels/gated_delta_rule/cuda/gatedDeltaRuleChunk.cuh step by step (64-token chunks, fp32
products and accumulation, the same row factors and decays) and rounds values where the kernel
does. Prints the relative RMS of o and the final state against the float64 recurrence on
correlated keys (tests/conftest.py gdn_inputs(correlated=True)), worst over seeds: the kernels
before the 2026-11-30 precision fix (every site rounded to bf16), with one site rounded at a time,
and with the current scheme.

Each rounding site has a mode:
  'bf16'  round to the activation dtype (what the kernel does today)
  'split' value kept as hi + lo (hi = rnd(x), lo = rnd(x - hi)): a split-bf16 tensor-core product
  'f32'   kept in the accumulation dtype (fp32 workspace / fp32 operand)
Sites: Tk, Tv (inverse-derived operand matrices), w, u, P (workspace tiles), vop (v_new for P v_new),
vk (fk v_new for the state update), Sop (state operand for w S and q S).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from gdn_export.ops.gated_delta_rule.naive import recurrent_gated_delta_rule  # noqa: E402
from tests.conftest import gdn_inputs  # noqa: E402

SITES = ["Tk", "Tv", "w", "u", "P", "vop", "vk", "Sop"]
C = 64


def make_rnd(act, acc):
    def rnd(x, mode):
        if mode == "f32" or act == acc:
            return x
        hi = x.to(act).to(acc)
        if mode == "bf16":
            return hi
        if mode == "split":
            return hi + (x - hi).to(act).to(acc)
        raise ValueError(mode)
    return rnd


def parts(x, mode, act, acc):
    """(hi, lo) operand pair of a split product; lo = 0 unless mode == 'split'."""
    if mode == "f32" or act == acc:
        return x, torch.zeros_like(x)
    hi = x.to(act).to(acc)
    lo = (x - hi).to(act).to(acc) if mode == "split" else torch.zeros_like(x)
    return hi, lo


def emulate(q, k, v, g, beta, s0, scale, modes, acc=torch.float32):
    act = q.dtype
    rnd = make_rnd(act, acc)
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    grp = Hv // Hk
    # kernel inputs are raw activations; everything below is fp32 (acc) arithmetic
    qf = q.to(acc).repeat_interleave(grp, 2).transpose(1, 2)  # [B, H, T, Dk]
    kf = k.to(acc).repeat_interleave(grp, 2).transpose(1, 2)
    vf = v.to(acc).transpose(1, 2)
    gf = g.to(acc).transpose(1, 2)
    bf = beta.to(acc).transpose(1, 2)
    pad = (-T) % C
    if pad:
        qf, kf, vf = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (qf, kf, vf))
        gf, bf = (torch.nn.functional.pad(x, (0, pad)) for x in (gf, bf))
    n = (T + pad) // C
    qc, kc, vc = (x.reshape(B, Hv, n, C, -1) for x in (qf, kf, vf))
    gc, bc = (x.reshape(B, Hv, n, C) for x in (gf, bf))
    G = gc.cumsum(-1)
    eps = 1e-6
    rk = torch.rsqrt((kc * kc).sum(-1) + eps)
    rq = scale * torch.rsqrt((qc * qc).sum(-1) + eps)
    lower = torch.ones(C, C, dtype=torch.bool).tril()
    slower = torch.ones(C, C, dtype=torch.bool).tril(-1)
    dec = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    KK = kc @ kc.transpose(-1, -2)
    QK = qc @ kc.transpose(-1, -2)
    A = (bc[..., :, None] * KK * rk[..., :, None] * rk[..., None, :] * dec).masked_fill(~slower, 0)
    P = (QK * rq[..., :, None] * rk[..., None, :] * dec).masked_fill(~lower, 0)
    Ph, Pl = parts(P, modes["P"], act, acc)
    P = rnd(P, modes["P"])
    eye = torch.eye(C, dtype=acc)
    Tm = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
    Tk = rnd(Tm * (bc * G.exp() * rk)[..., None, :], modes["Tk"])
    Tv = rnd(Tm * bc[..., None, :], modes["Tv"])
    w = rnd(Tk @ kc, modes["w"])
    u = rnd(Tv @ vc, modes["u"])
    fq = rq * G.exp()
    fk = rk * (G[..., -1:] - G).exp()
    dl = G[..., -1].exp()
    S = torch.zeros(B, Hv, Dk, Dv, dtype=acc) if s0 is None else s0.to(acc).clone()
    o = torch.empty(B, Hv, n, C, Dv, dtype=acc)
    for c in range(n):
        Sop = rnd(S, modes["Sop"])
        X = w[:, :, c] @ Sop
        Y = (qc[:, :, c] @ Sop) * fq[:, :, c, :, None]
        vnew = u[:, :, c] - X
        vk = rnd(vnew * fk[:, :, c, :, None], modes["vk"])
        # as the kernel: P_hi v_hi + P_hi v_lo + P_lo v_hi (no lo lo term)
        vh, vl = parts(vnew, modes["vop"], act, acc)
        o[:, :, c] = Y + (Ph[:, :, c] @ vh + Ph[:, :, c] @ vl) + Pl[:, :, c] @ vh
        S = dl[:, :, c, None, None] * S + kc[:, :, c].transpose(-1, -2) @ vk
    o = o.reshape(B, Hv, n * C, Dv)[:, :, :T].transpose(1, 2)
    return o.to(act), S.float()


def rel(a, e):
    a, e = a.double(), e.double()
    return ((a - e).norm() / e.norm()).item()


CASES = {
    "T65-D64": (2, 65, 2, 4, 64, 64),
    "T1000-D128": (1, 1000, 2, 4, 128, 128),
}


def reference(x, scale):
    xd = {kk: (None if vv is None else vv.double()) for kk, vv in x.items()}
    o, s = recurrent_gated_delta_rule(**xd, scale=scale, use_qk_l2norm=True)
    return o, s.double()


def run(cases, configs, seeds, act=torch.bfloat16, acc=torch.float32, correlated=True):
    refs = {}
    for cname in cases:
        for sd in seeds:
            x = gdn_inputs(*CASES[cname], dtype=act, correlated=correlated, seed=sd)
            scale = CASES[cname][4] ** -0.5
            refs[(cname, sd)] = (x, scale, reference(x, scale))
    rows = []
    for name, modes in configs:
        line = [name]
        for cname in cases:
            eo, es = [], []
            for sd in seeds:
                x, scale, (ro, rs) = refs[(cname, sd)]
                o, s = emulate(x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], scale, modes, acc)
                # the test compares against the reference rounded to the output dtype
                eo.append(rel(o, ro.to(act)))
                es.append(rel(s, rs))
            line.append(f"{max(eo):.4f}/{max(es):.4f}")
        rows.append(line)
        print(" | ".join(line), flush=True)
    return rows


# The current kernels: u in fp32, w rounded (costs ~1e-3), the rest as hi + lo pairs.
CURRENT = dict(Tk="split", Tv="split", w="bf16", u="f32", P="split", vop="split", vk="split", Sop="split")


def main() -> None:
    before = dict.fromkeys(SITES, "bf16")
    configs = [("before: every site bf16", before), ("no site rounded", dict.fromkeys(SITES, "f32"))]
    configs += [(f"only {s} rounded", {**dict.fromkeys(SITES, "f32"), s: "bf16"}) for s in SITES]
    configs += [("current kernels", CURRENT)]
    print("config | " + " | ".join(f"{c} o/state" for c in CASES) + "  (bf16, worst of 4 seeds)")
    run(list(CASES), configs, seeds=[0, 1, 2, 3])


if __name__ == "__main__":
    main()
