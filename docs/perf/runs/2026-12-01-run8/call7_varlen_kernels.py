"""Run 8, device call 7: the Triton prefill's two kernels timed apart, one 16K sequence as a batch of
one and as a cu_seqlens pack of one (bf16, Hk 16, Hv 32, D 128), plus the wrapper's host-side pieces."""
import torch
import torch.nn.functional as F
from triton.testing import do_bench

from gdn_kernels.chunk import chunk_gated_delta_rule, chunk_state_output_fwd
from gdn_kernels.utils import chunk_indices, prepare_inputs
from gdn_kernels.wy import chunk_wy_fwd

T, HK, HV, D = 16384, 16, 32, 128
q = torch.randn(1, T, HK, D, device="cuda").bfloat16()
k = F.silu(torch.randn(1, T, HK, D, device="cuda")).bfloat16()
v = torch.randn(1, T, HV, D, device="cuda").bfloat16()
g = -F.softplus(torch.randn(1, T, HV, device="cuda") - 4)
beta = torch.sigmoid(torch.randn(1, T, HV, device="cuda")).bfloat16()
s0 = torch.randn(1, HV, D, D, device="cuda") * 0.1
cu = torch.tensor([0, T], device="cuda", dtype=torch.int32)
ms = lambda f: do_bench(f, warmup=10, rep=100, return_mode="median")  # noqa: E731
for name, c in (("batched", None), ("packed", cu)):
    qq, kk, vv, gg, bb, gates, scale, cc, offs = prepare_inputs(q, k, v, g, beta, None, None, c)
    idx = None if cc is None else chunk_indices(cc, T, offs)
    wy = lambda: chunk_wy_fwd(qq, kk, vv, gg, bb, scale, True, cc, idx)  # noqa: E731
    w, u, A, gc, fq, fk = wy()
    st = lambda: chunk_state_output_fwd(qq, kk, w, u, A, gc, fq, fk, s0, cc)  # noqa: E731
    whole = lambda: chunk_gated_delta_rule(q, k, v, g, beta, s0, None, True, c)  # noqa: E731
    o1, s1 = whole()
    print(f"{name:8s} wy {ms(wy):.3f} ms  state/output {ms(st):.3f} ms  whole {ms(whole):.3f} ms  "
          f"prepare {ms(lambda: prepare_inputs(q, k, v, g, beta, None, None, c)):.3f} ms", flush=True)
    if c is None:
        ref = o1
    else:
        print(f"packed vs batched o: max abs diff {(o1.float() - ref.float()).abs().max().item():.3e}")
