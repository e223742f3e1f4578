#!/usr/bin/env bash
# device call 4 (2026-11-30 session 2): the whole Triton GPU test grid after the split removal
set -u
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
t0=$SECONDS
timeout 340 python3 -m pytest -q -m gpu -p no:cacheprovider -n 12 tests/kernels > $OUT/triton_grid.log 2>&1
echo "triton grid rc=$? $((SECONDS-t0))s"
tail -n 2 $OUT/triton_grid.log; grep -E "^FAILED" $OUT/triton_grid.log | head
