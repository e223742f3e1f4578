#!/usr/bin/env bash
# Run 14, device call B: the 16-bit-state decode kernel with its reduction S^T [k q] on the tensor
# cores (mma.sync; the tile's chunks swizzled for ldmatrix). The decode harness (every tile checked
# against its float64 reference, then timed beside the grid's copy floor), the 16-bit-state CUDA
# tests, and the plugin host test with compute-sanitizer memcheck / racecheck.
set -u
out=$OUT/b; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels:$PWD/benchmarks PYTHONUNBUFFERED=1
( nvcc -O3 -std=c++17 -arch=sm_90 -I plugins -o /tmp/decode16_tiles benchmarks/cuda/decode16_tiles.cu \
    plugins/gatedDeltaRulePlugin/gatedDeltaRuleKernels.cu > "$out/tiles_build.log" 2>&1 ) &
bp=$!
( plugins/tests/runOnDevice.sh "$out/plugins" 90 "$PWD/.carry/tensorrt/include" > "$out/plugins.log" 2>&1 ) &
pp=$!
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|error' "$out/$n.log" | tail -1 | cut -c1-100)")"); }
step state 400 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_state_dtype_cuda.py
wait $bp
step tiles 90 /tmp/decode16_tiles
wait $pp
tail -16 "$out/tiles.log"
grep -E "^check" "$out/tiles.log"
grep -hE "FAILED|Error" "$out"/state.log | head -8
tail -6 "$out/plugins.log"
printf '%s\n' "${sum[@]}"
