"""Scratch (not part of the repo): attention_prefill vs the SDPA route at the 1.66B model's prefill."""
import sys
sys.path[:0] = [".", "kernels"]
import torch
from triton.testing import do_bench
import gdn_kernels.attention_prefill as P
from gdn_export.ops.attention import _attention_sdpa

compiled = {}
real = P.attn_prefill_kernel
class Proxy:
    def __getitem__(self, grid):
        def launch(*a, **kw):
            k = real[grid](*a, **kw)
            compiled[(kw["BLOCK_M"], kw["BLOCK_N"], kw["num_warps"], kw["num_stages"])] = k
            return k
        return launch
P.attn_prefill_kernel = Proxy()
default = P.config

def inputs(B, H, Hkv, S, L, D, past):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, S, H, D, device="cuda", generator=g).bfloat16().transpose(1, 2)
    k = torch.randn(B, Hkv, L, D, device="cuda", generator=g).bfloat16()
    v = torch.randn(B, Hkv, L, D, device="cuda", generator=g).bfloat16()
    pos = torch.tensor(past, device="cuda")[:, None] + torch.arange(S, device="cuda")
    m = (torch.arange(L, device="cuda")[None, None] <= pos[:, :, None])[:, None]
    return q, k, v, m

cfgs = {256: [None], 128: [None], 64: [None], 32: [None]}
shapes = [(1, 16, 2, 4096, 4128, 256, [0]), (4, 16, 2, 1024, 4128, 256, [0, 100, 1000, 3000]),
          (1, 16, 2, 512, 4128, 256, [0]), (1, 16, 2, 128, 4128, 256, [0]), (8, 16, 2, 512, 4128, 256, [0, 500, 1000, 1500, 2000, 2500, 3000, 3500]), (1, 16, 2, 4096, 4128, 128, [0]), (1, 16, 2, 4096, 4128, 64, [0])]


def graph_time(fn):
    fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, warmup=5, rep=50)


for B, H, Hkv, S, L, D, past in shapes:
    q, k, v, m = inputs(B, H, Hkv, S, L, D, past)
    sc = D ** -0.5
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m, scale=sc, enable_gqa=True)
    t_sdpa = do_bench(lambda: _attention_sdpa(q, k, v, m, sc), warmup=5, rep=50)
    t_rng = graph_time(lambda: P.kv_ranges(m, L, 64))
    for tile, warps in ((8192, 8), (16384, 4), (16384, 8), (32768, 8), (65536, 8)):
        P.RANGE_TILE, P.RANGE_WARPS = tile, warps
        print(f"   kv_ranges tile {tile} warps {warps}: {graph_time(lambda: P.kv_ranges(m, L, 64)) * 1000:.1f} us")
    P.RANGE_TILE, P.RANGE_WARPS = 8192, 4
    print(f"B{B} S{S} L{L} D{D} past{past}: sdpa {t_sdpa:.3f} ms, kv_ranges (graph) {t_rng*1000:.0f} us", flush=True)
    for cfg in cfgs[D]:
        if cfg is not None:
            P.config = lambda D, sm90, cfg=cfg: cfg
        else:
            P.config = default
            cfg = default(D, True)
        try:
            o = P.attention_prefill(q, k, v, m, sc)
            err = ((o.float() - ref).norm() / ref.norm()).item()
            t = do_bench(lambda: P.attention_prefill(q, k, v, m, sc), warmup=5, rep=50)
            tg = graph_time(lambda: P.attention_prefill(q, k, v, m, sc))
            kk = compiled[cfg]
            print(f"   {cfg}: eager {t:.3f} ms graph {tg:.3f} ms  err {err:.2e}  regs {kk.n_regs} spills {kk.n_spills} shared {kk.metadata.shared}", flush=True)
        except Exception as e:
            print(f"   {cfg}: FAIL {type(e).__name__} {str(e)[:200]}", flush=True)
