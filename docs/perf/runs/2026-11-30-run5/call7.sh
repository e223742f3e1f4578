#!/usr/bin/env bash
# device call 7 (2026-11-30 session 3): final checks after the raw-operand Triton prefill (16-bit
# operands only for head dims that are multiples of 64), new chunk.py defaults and the CUDA fp32
# 3xTF32 products: Triton grid, whole tiny models (triton + cuda), tests/cuda, plugin host test
# with sanitizers, then the benchmark with all four implementations
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/kernels PYTHONUNBUFFERED=1
s() { local n=$1 l=$2; shift 2; local t0=$SECONDS; timeout $l "$@" > $OUT/$n.log 2>&1; echo "$n rc=$? $((SECONDS-t0))s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $OUT/gpu.txt
( timeout 280 plugins/tests/runOnDevice.sh $OUT/plugins 90 "$PWD/.carry/tensorrt/include" > $OUT/plugins.log 2>&1; echo "plugins rc=$?" >> $OUT/plugins.log ) &
s gpu_tests_triton 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/kernels &
( s gpu_tests_models 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/models/test_op_backends_gpu.py
  s gpu_tests_cuda 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda ) &
wait
s bench 170 python3 benchmarks/bench_kernels.py --out $OUT/bench --only gdn --cuda
for f in gpu_tests_triton gpu_tests_models gpu_tests_cuda; do echo "== $f: $(tail -n 1 $OUT/$f.log)"; grep -E "^FAILED|^E  " $OUT/$f.log | cut -c1-160 | head -6; done
tail -n 8 $OUT/plugins.log
grep -E "^\| (decode|prefill)" $OUT/bench/bench_kernels.md | grep -vE "alone|profile" | cut -c1-90
