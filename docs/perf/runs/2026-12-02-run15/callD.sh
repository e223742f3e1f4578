#!/usr/bin/env bash
# Run 15, device call D: the final tree (the split walk's exchange pointer moved inside the branch
# that uses it; comments): the split-walk and walk-width tests once more.
set -u
out=$OUT/d; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels:$PWD/benchmarks PYTHONUNBUFFERED=1
timeout 220 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_chunk_walk_cuda.py \
    -k "split or widths_match" > "$out/walk.log" 2>&1
echo "rc=$?"; grep -hE "FAILED|Error" "$out/walk.log" | head -5; tail -1 "$out/walk.log"
