#!/usr/bin/env bash
# device call 8 (2026-11-30 session 3): CUDA kernels alone (GPU time per decode step by CUDA-graph replay)
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
timeout 230 python3 benchmarks/cuda_kernels_bench.py --out $OUT/cuda_kernels_bench.md --only-cuda > $OUT/cuda_kernels_bench.log 2>&1
