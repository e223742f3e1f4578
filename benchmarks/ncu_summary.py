"""The headline metrics of each kernel in an Nsight Compute report: duration, DRAM and SM
throughput, instructions per cycle, registers, dynamic shared memory, achieved occupancy.

    python3 benchmarks/ncu_summary.py REPORT.ncu-rep

Source lines by stall samples (reports collected with `--import-source yes` on a -lineinfo build):
`ncu -i REPORT.ncu-rep --page source --print-source cuda --csv`.
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys

HEADLINE = ("Duration", "DRAM Throughput", "Compute (SM) Throughput", "Achieved Occupancy",
            "Registers Per Thread", "Dynamic Shared Memory Per Block", "Executed Ipc Active")


def headline(report: str) -> list[str]:
    text = subprocess.run(["ncu", "-i", report, "--csv", "--page", "details"], check=True, capture_output=True,
                          text=True).stdout
    rows = csv.DictReader(io.StringIO("\n".join(ln for ln in text.splitlines() if ln.startswith('"'))))
    return [f"{r.get('Kernel Name', '')[:40]:40s} {r['Metric Name']:32s} {r['Metric Value']:>12s} {r.get('Metric Unit', '')}"
            for r in rows if r.get("Metric Name") in HEADLINE]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report")
    args = ap.parse_args(argv)
    print("\n".join(headline(args.report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
