#!/usr/bin/env bash
# device call 6 (2026-11-30 session 2): CUDA prefill precision fix: plugin host test + sanitizers, cuda / model tests, bench
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/kernels PYTHONUNBUFFERED=1
( timeout 250 plugins/tests/runOnDevice.sh $OUT/plugins 90 "$PWD/.carry/tensorrt/include" > $OUT/plugins.log 2>&1; echo "plugins rc=$?" >> $OUT/plugins.log ) &
s() { local n=$1 l=$2; shift 2; local t0=$SECONDS; timeout $l "$@" > $OUT/$n.log 2>&1; echo "$n rc=$? $((SECONDS-t0))s"; }
s cuda 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda
s models 70 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/models/test_op_backends_gpu.py
wait
s bench 110 python3 benchmarks/bench_kernels.py --out $OUT/bench --only gdn --cuda --prefill 1x16384 8x8192 1x65536
for f in cuda models; do echo "== $f: $(tail -n 1 $OUT/$f.log)"; grep -E "^FAILED|^E  " $OUT/$f.log | cut -c1-160 | head -8; done
tail -n 9 $OUT/plugins.log
grep -E "^\| (decode|prefill)" $OUT/bench/bench_kernels.md | grep -E "\| (ours|cuda|fla) \|" | cut -c1-90
