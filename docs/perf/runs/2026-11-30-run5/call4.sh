#!/usr/bin/env bash
# device call 4 (2026-11-30 session 3): the raw-operand Triton prefill (wy.py + transposed-state chunk.py)
# on the GPU test grid and whole tiny models, then the benchmark (triton / FLA / reference) and the sweep
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/kernels PYTHONUNBUFFERED=1
s() { local n=$1 l=$2; shift 2; local t0=$SECONDS; timeout $l "$@" > $OUT/$n.log 2>&1; echo "$n rc=$? $((SECONDS-t0))s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $OUT/gpu.txt
s gpu_tests_models_triton 250 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/models/test_op_backends_gpu.py -k triton &
s gpu_tests_triton 250 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/kernels
wait
s bench 150 python3 benchmarks/bench_kernels.py --out $OUT/bench --only gdn --profile
s sweep 110 python3 benchmarks/bench_kernels.py --out $OUT/sweep --only sweep
for f in gpu_tests_triton gpu_tests_models_triton; do echo "== $f: $(tail -n 1 $OUT/$f.log)"; grep -E "^FAILED|^E  " $OUT/$f.log | cut -c1-160 | head -8; done
grep -E "^\| (decode|prefill)" $OUT/bench/bench_kernels.md | grep -E "\| (ours|fla|FLA[^|]*) \|" | cut -c1-100
grep -E "alone" $OUT/bench/bench_kernels.md | cut -c1-100
grep -E "sweep state" $OUT/sweep/bench_kernels.md | cut -c1-120
