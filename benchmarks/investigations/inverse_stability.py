"""Accuracy of (I + A)^-1 for the WY form's strictly lower A, by method and product precision (CPU).

    python benchmarks/investigations/inverse_stability.py

A_ij = beta_i k_i.k_j exp(G_i - G_j) (i > j) over one 64-token chunk, with keys as a model makes
them: SiLU(randn + c * common direction), L2-normalised (c = 0: independent Gaussian keys), strong
writes (beta = sigmoid(N(2, 1))) and slow decay. Prints the worst relative error of u = X v over
5 draws against float64 for the product form (I - A)(I + A^2)...(I + A^32) and for 16 x 16 forward
substitution merged by (I - N)(I + N^2) Xd (wy.py), each with TF32 or fp32 products. TF32 is
emulated by rounding both operands of every product to 10 mantissa bits.
"""

from __future__ import annotations

import torch


def tf32(x: torch.Tensor) -> torch.Tensor:
    i = x.contiguous().view(torch.int32)
    return ((i + 0x1000) & ~0x1FFF).view(torch.float32)


def mm(a, b, precision):
    return tf32(a) @ tf32(b) if precision == "tf32" else a @ b


def product_form(A, precision):
    X, P, k = torch.eye(64) - A, mm(A, A, precision), 2
    X = X + mm(X, P, precision)
    while 2 * k < 64:
        P = mm(P, P, precision)
        X = X + mm(X, P, precision)
        k *= 2
    return X


def substitution_merge(A, precision):
    block = torch.arange(64) // 16
    Xd = torch.zeros(64, 64)
    for b in range(0, 64, 16):  # forward substitution, exact fp32
        L, Y = A[b:b + 16, b:b + 16], torch.eye(16)
        for i in range(1, 16):
            Y[i, :i] = -(L[i, :i] @ Y[:i, :i])
        Xd[b:b + 16, b:b + 16] = Y
    N = mm(Xd, torch.where(block[:, None] > block[None, :], A, 0.0), precision)
    Y = Xd + mm(N, mm(N, Xd, precision), precision)
    return Y - mm(N, Y, precision)


def main() -> None:
    torch.manual_seed(0)
    methods = {f"{name}, {p}": (fn, p) for name, fn in (("product form", product_form),
                                                       ("substitution + merge", substitution_merge))
               for p in ("tf32", "fp32")}
    print("| keys | " + " | ".join(methods) + " |")
    print("|---" * (len(methods) + 1) + "|")
    for c in (0.0, 1.0, 2.0, 4.0):
        worst = dict.fromkeys(methods, 0.0)
        for _ in range(5):
            k = torch.randn(64, 128) + c * torch.randn(1, 128)
            k = torch.nn.functional.silu(k) if c else k
            k = k / k.norm(dim=1, keepdim=True)
            beta = torch.sigmoid(torch.randn(64) + 2)
            G = (-torch.nn.functional.softplus(torch.randn(64)) * 0.01).cumsum(0)
            A = torch.tril(beta[:, None] * (k @ k.T) * torch.exp(G[:, None] - G[None, :]), -1)
            v = torch.randn(64, 32, dtype=torch.float64)
            truth = torch.linalg.solve(torch.eye(64, dtype=torch.float64) + A.double(), v)
            for name, (fn, p) in methods.items():
                err = ((fn(A, p).double() @ v - truth).norm() / truth.norm()).item()
                worst[name] = max(worst[name], err)
        print(f"| c = {c:g} | " + " | ".join(f"{e:.1e}" for e in worst.values()) + " |")


if __name__ == "__main__":
    main()
