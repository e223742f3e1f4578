#!/usr/bin/env bash
# Run 13, device call E: packed sequences keep the double-buffered walk (call D: the ragged pack took
# 1.97 ms single-buffered against run 12's 1.81): the ragged pack and 8 x 8K without FLA, the walk's
# tests.
set -u
out=$OUT/e; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_chunk_walk_cuda.py > "$out/walk.log" 2>&1
echo "walk rc=$? $(tail -1 "$out/walk.log")"
timeout 150 python3 benchmarks/prefill_pack_bench.py --no-flashinfer --no-fla --cases 3,7 --out-dir "$out" \
  --backends cuda > "$out/pack.log" 2>&1
echo "pack rc=$?"
grep -E "^\| " "$out/prefill_pack_bench.md" 2>/dev/null || tail -12 "$out/pack.log"
