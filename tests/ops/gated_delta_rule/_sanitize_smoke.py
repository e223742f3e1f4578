"""Small runs of every CUDA kernel path, for compute-sanitizer (memcheck / racecheck / synccheck).

    compute-sanitizer --tool racecheck python3 tests/ops/gated_delta_rule/_sanitize_smoke.py

Not collected by pytest (leading underscore); prints one line per case with the relative error.
"""

import torch
import torch.nn.functional as F

from gdn_export.ops.causal_conv1d import cuda as conv_cuda
from gdn_export.ops.gated_delta_rule import cuda as gdr_cuda
from gdn_export.ops.causal_conv1d.naive import causal_conv1d as conv_ref
from gdn_export.ops.gated_delta_rule.naive import chunked_gated_delta_rule


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    torch.manual_seed(0)
    dev = "cuda"
    for dtype in (torch.float32, torch.bfloat16):
        for T, path, cu in ((1, 1, None), (70, 2, None), (70, 1, None), (90, 0, [0, 10, 90])):
            B = 1 if cu else 2
            Dk, Dv = 64, 40
            q = torch.randn(B, T, 1, Dk, device=dev).to(dtype)
            k = torch.randn(B, T, 1, Dk, device=dev).to(dtype)
            v = torch.randn(B, T, 2, Dv, device=dev).to(dtype)
            g = -F.softplus(torch.randn(B, T, 2, device=dev)) * 0.2
            beta = torch.sigmoid(torch.randn(B, T, 2, device=dev)).to(dtype)
            cus = None if cu is None else torch.tensor(cu, device=dev, dtype=torch.int32)
            N = B if cu is None else len(cu) - 1
            s0 = torch.randn(N, 2, Dk, Dv, device=dev) * 0.1
            o, s = gdr_cuda.gated_delta_rule(q, k, v, g, beta, s0, Dk**-0.5, True, cus, path=path)
            ro, rs = chunked_gated_delta_rule(q, k, v, g, beta, s0, Dk**-0.5, True, cus)
            print(f"gdr {dtype} T={T} path={path} varlen={cu is not None}: o {rel(o, ro):.2e} state {rel(s, rs):.2e}")
        for T in (1, 2, 70):
            x = torch.randn(2, T, 72, device=dev).to(dtype)
            w = torch.randn(72, 4, device=dev).to(dtype)
            b = torch.randn(72, device=dev).to(dtype)
            st = torch.randn(2, 72, 3, device=dev).to(dtype)
            ry, rs = conv_ref(x, w, b, st, True)
            y = conv_cuda.causal_conv1d_inplace(x, w, b, st, True)
            print(f"conv {dtype} T={T} in place: y {rel(y, ry):.2e} state {rel(st, rs):.2e}")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
