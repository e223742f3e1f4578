"""Compile the prefill kernels for sm_90 without a GPU and print their resource use.

    python benchmarks/sm90_compile_report.py

For each kernel and launch configuration (bf16, Dk = Dv = 128, q/k L2 norm, initial state, as in
bench_kernels.py): registers per thread, stack bytes (spills), spill loads / stores (LDL / STL),
wgmma (HGMMA) instructions, shared memory, and the SASS's instruction, shuffle, barrier and
shared-memory load / store counts (static: a loop body counts once). Uses the ptxas and cuobjdump
that ship with Triton; costs no device time. Register use differs between Triton versions: run it
with the device's (3.6, e.g. from a separate venv with torch on PYTHONPATH) to match its numbers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "kernels")]
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SHAPE = dict(DK=128, DV=128, BK=128)


def report(fn, signature, constexprs, num_warps, num_stages=2) -> str:
    # pointers and token strides get the divisibility-by-16 hint a launch of aligned tensors gets
    # (Triton specialises them; T and the head counts are do_not_specialize)
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name in signature and (signature[name].startswith("*") or name in ("sq", "sk", "sv"))}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 64),
                       options=dict(num_warps=num_warps, num_stages=num_stages))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name],
                             capture_output=True, text=True).stdout
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name],
                              capture_output=True, text=True).stdout
    usage = next(line for line in res.splitlines() if "REG:" in line).split()
    regs, stack = (next(u for u in usage if u.startswith(p)).split(":")[1] for p in ("REG:", "STACK:"))
    # one SASS instruction per line "/*0a70*/  OPCODE ..."; a static count (loops count once)
    ops = [m.group(1).split(".")[0] for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)]
    count = lambda *names: sum(op in names for op in ops)  # noqa: E731
    return (f"{regs:>4} {stack:>5} {count('LDL'):>4} {count('STL'):>4} "
            f"{count('HGMMA'):>5} {k.metadata.shared:>7} {len(ops):>6} {count('SHFL'):>5} "
            f"{count('BAR'):>4} {count('LDS', 'LDSM'):>5} {count('STS'):>5}")


def main() -> int:
    from kernels.gated_delta_rule.triton.chunk import chunk_fused_fwd_kernel, chunk_state_output_fwd_kernel
    from kernels.gated_delta_rule.triton.wy import chunk_wy_fwd_kernel

    p = lambda names, t: {n: t for n in names.split()}  # noqa: E731
    wy_sig = dict(p("q k v beta b w", "*bf16"), **p("g a A_log dt_bias u Aqk gcum fq fk", "*fp32"),
                  **p("cu_seqlens chunk_indices", "*i32"), scale="fp32", **p("T sq sk sv HK HV", "i32"))
    fused_sig = dict(p("q k w o", "*bf16"), **p("u Aqk gcum fq fk h0 ht", "*fp32"), cu_seqlens="*i32",
                     **p("T sq sk HK HV", "i32"))
    flags = dict(IS_VARLEN=False, IEEE=False, SPLIT=True)
    rows = []
    for bv, nw in ((64, 4), (32, 4), (64, 8), (32, 8)):
        c = dict(SHAPE, BV=bv, USE_L2NORM=True, USE_GATE=False, **flags)
        rows.append((f"wy.py BV={bv} warps={nw}", report(chunk_wy_fwd_kernel, wy_sig, c, nw)))
    for bv, nw, ns in ((32, 4, 3), (32, 4, 2), (32, 8, 3), (64, 8, 2), (64, 4, 2)):
        c = dict(SHAPE, BV=bv, USE_INITIAL_STATE=True, NUM_STAGES=ns, **flags)
        rows.append((f"chunk.py BV={bv} warps={nw} stages={ns}",
                     report(chunk_state_output_fwd_kernel, fused_sig, c, nw, ns)))
    # the fused form: wy.py's inverse only, then the sequential kernel that forms w h, u, Aqk per chunk
    # the pointer dtypes chunk_inverse_fwd passes (X in w's, u's and Aqk's places; the row factors in
    # gcum's, fq's and fk's)
    inv_wy_sig = dict(wy_sig, **p("w u Aqk", "*fp32"))
    for nw in (4, 8):
        c = dict(SHAPE, BV=16, USE_L2NORM=True, USE_GATE=False, INVERSE=True, **flags)
        rows.append((f"wy.py INVERSE warps={nw}", report(chunk_wy_fwd_kernel, inv_wy_sig, c, nw)))
    inv_sig = dict(p("q k v o", "*bf16"), **p("X gcum rq rk h0 ht", "*fp32"), cu_seqlens="*i32",
                   **p("T sq sk sv HK HV", "i32"))
    for bv, nw, ns in ((32, 4, 3), (32, 4, 2), (64, 4, 2), (32, 8, 3), (64, 8, 2), (16, 4, 3)):
        c = dict(SHAPE, BV=bv, USE_INITIAL_STATE=True, NUM_STAGES=ns, **flags)
        rows.append((f"chunk.py fused BV={bv} warps={nw} stages={ns}",
                     report(chunk_fused_fwd_kernel, inv_sig, c, nw, ns)))
    width = max(len(name) for name, _ in rows)
    print(f"{'kernel / configuration':<{width}}  REGS STACK  LDL  STL HGMMA  SHARED  INSTR  SHFL  BAR   LDS   STS")
    for name, line in rows:
        print(f"{name:<{width}}  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
