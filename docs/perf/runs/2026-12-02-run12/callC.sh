#!/usr/bin/env bash
# Run 12, device call C: the plugin host test, compute-sanitizer memcheck and racecheck (its --quick
# set runs the mma.sync walk at T = 65, bf16, fp32 and bf16 states) and, beside it, the walk's GPU
# tests after the launcher's width choice became "widest that fits".
set -u
out=$OUT/c; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
( timeout 330 python3 -m pytest -x -q -rf -p no:cacheprovider tests/cuda/test_chunk_walk_cuda.py \
    tests/cuda/test_gated_delta_rule_cuda.py -k "walk or grid or varlen or correlated" > "$out/walk.log" 2>&1; echo "rc=$?" >> "$out/walk.log" ) &
plugins/tests/runOnDevice.sh "$out/plugins" 90 "$PWD/.carry/tensorrt/include" > "$out/plugins.log" 2>&1
wait
tail -12 "$out/plugins.log"
tail -3 "$out/walk.log"
