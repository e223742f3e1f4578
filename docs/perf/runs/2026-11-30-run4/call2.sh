#!/usr/bin/env bash
# device call 2 (2026-11-30 session 2): benchmark with the stable WY inverse, decode sweep, GPU tests
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/kernels PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee $OUT/gpu.txt
s() { local n=$1 l=$2; shift 2; local t0=$SECONDS; timeout $l "$@" > $OUT/$n.log 2>&1; echo "$n rc=$? $((SECONDS-t0))s"; }
s bench 300 python3 benchmarks/bench_kernels.py --out $OUT/bench --only gdn --cuda --profile
s decode_sweep 60 python3 benchmarks/bench_kernels.py --out $OUT/sweep --only sweep-decode
s triton_corr 120 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/kernels/test_gpu_kernels.py -k "correlated or varlen or dk_ne"
s cuda_corr 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda/test_gated_delta_rule_cuda.py -k correlated
for f in triton_corr cuda_corr; do tail -n 1 $OUT/$f.log; grep FAILED $OUT/$f.log | head -8; done
grep -E "^\| (decode|prefill)" $OUT/bench/bench_kernels.md | grep -v "profile" | cut -c1-100
grep -E "sweep decode" $OUT/sweep/bench_kernels.md | cut -c1-80
