"""SASS instructions of a CUDA (plugin) kernel, phase by phase: where an instruction-bound kernel
spends its issue slots, on a machine without a GPU.

    python3 benchmarks/investigations/sass_phases.py [--kernel Prepare16KernelI13__nv_bfloat16Li128ELi128E]
                                      [--arch sm_90] [--cubin FILE] [--out-dir DIR]

Compiles kernels/gated_delta_rule/cuda/gatedDeltaRuleKernels.cu to a cubin with nvcc (about two
minutes; --cubin reuses one), disassembles the first kernel whose mangled name contains --kernel
with cuobjdump (the CUDA toolkit's, or the one Triton ships), and splits its instructions at every
block barrier (BAR): one row per phase with its instruction count and most frequent opcodes. Counts
are static (an unrolled loop counts once per copy, a rolled one once), so they compare versions of a
kernel, they do not time it. It read the wmma prepare kernel's for bf16 (8.9K instructions; two
product phases of ~2050 each, mostly generic loads, MOVM transposes and address arithmetic; built
from commit 0aeeedb, before the 16-bit inputs moved to the mma.sync kernel) against the mma.sync
one's (4.5K): docs/perf/runs/2026-12-02-run15/sass/.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/records.py
from records import out_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "kernels" / "gated_delta_rule" / "cuda" / "gatedDeltaRuleKernels.cu"
INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)")


def cuobjdump() -> str:
    """The toolkit's cuobjdump, else the one bundled with Triton."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        triton = None
    if triton is not None:
        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if bundled.exists():
            return str(bundled)
    sys.exit("sass_phases: cuobjdump not found (install the CUDA toolkit's, or triton, which bundles one)")


def phases(sass: str) -> list[tuple[str, collections.Counter]]:
    """(address of the closing barrier or 'end', opcode counts) per barrier-delimited phase."""
    out, cur = [], collections.Counter()
    for line in sass.splitlines():
        m = INSTRUCTION.match(line)
        if not m:
            continue
        op = m.group(2).split(".")[0]
        cur[op] += 1
        if op == "BAR":
            out.append((m.group(1), cur))
            cur = collections.Counter()
    out.append(("end", cur))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", default="Prepare16KernelI13__nv_bfloat16Li128ELi128E",
                    help="a substring of the kernel's mangled name")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--cubin", help="an existing cubin of gatedDeltaRuleKernels.cu")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    args.out_dir = out_dir(args.out_dir, "sass_phases")
    tool = cuobjdump()
    cubin = args.cubin
    if cubin is None:
        cubin = str(Path(tempfile.mkdtemp()) / "gdr.cubin")
        print(f"compiling {SOURCE.name} for {args.arch} ...", file=sys.stderr, flush=True)
        subprocess.run(["nvcc", "-O3", "-std=c++17", f"-arch={args.arch}", "-I", str(ROOT / "kernels"),
                        "-cubin", "-o", cubin, str(SOURCE)], check=True)
    usage = subprocess.run([tool, "-res-usage", cubin], check=True, capture_output=True, text=True).stdout
    names = [n for n in re.findall(r"Function (\S+):", usage) if args.kernel in n]
    if not names:
        sys.exit(f"sass_phases: no kernel name contains {args.kernel!r}")
    sass = subprocess.run([tool, "-sass", "-fun", names[0], cubin], check=True, capture_output=True,
                          text=True).stdout
    rows = phases(sass)
    total = sum(sum(c.values()) for _, c in rows)
    lines = [f"`{names[0]}` ({args.arch}): {total} instructions", "",
             "| phase (ends at) | instructions | top opcodes |", "|---|---|---|"]
    for addr, c in rows:
        top = ", ".join(f"{op} {n}" for op, n in c.most_common(8))
        lines.append(f"| {addr} | {sum(c.values())} | {top} |")
    table = "\n".join(lines)
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.out_dir) / "sass_phases.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
