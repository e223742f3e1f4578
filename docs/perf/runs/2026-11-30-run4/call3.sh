#!/usr/bin/env bash
# device call 3 (2026-11-30 session 2): plugin host test + sanitizers, cuda / triton / model GPU tests
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/kernels PYTHONUNBUFFERED=1
( timeout 480 plugins/tests/runOnDevice.sh $OUT/plugins 90 "$PWD/.carry/tensorrt/include" > $OUT/plugins.log 2>&1; echo "plugins rc=$?" >> $OUT/plugins.log ) &
s() { local n=$1 l=$2; shift 2; local t0=$SECONDS; timeout $l "$@" > $OUT/$n.log 2>&1; echo "$n rc=$? $((SECONDS-t0))s"; }
s cuda 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/cuda
s triton_corr 90 python3 -m pytest -q -m gpu -p no:cacheprovider -n 6 tests/kernels/test_gpu_kernels.py -k "correlated and not split"
s models 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/models/test_op_backends_gpu.py
wait
for f in cuda triton_corr models; do echo "== $f: $(tail -n 1 $OUT/$f.log)"; grep -E "^FAILED" $OUT/$f.log | cut -c1-150 | head -12; done
tail -n 12 $OUT/plugins.log
