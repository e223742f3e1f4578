#!/usr/bin/env bash
# Run 8, device call 7: where the Triton varlen prefill loses 1.5x on one 16K sequence (kernels apart).
set -u
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
timeout 100 python3 benchmarks/results/2026-12-01-run8/call7_varlen_kernels.py 2>&1 | tee $OUT/call7.log | tail -6
