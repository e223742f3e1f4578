#!/usr/bin/env bash
# Run 8, device call 4 (call 5 follows at once): stage the first half of FlashInfer (.carry/fi1) in /tmp;
# the decode16 tile widths through the public launcher (states rotated); the plugin host test under
# compute-sanitizer; the CUDA extension built (cached for call 5) with its 16-bit-state tests; the Triton
# varlen / chunk-index tests and the split-KV decode attention tests on the GPU.
set -u
out=$OUT/c4; mkdir -p "$out" /tmp/fi; cp .carry/fi1/* /tmp/fi/
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|PASSED|FAIL' "$out/$n.log" | tail -1 | cut -c1-100)")"); }
# the harness is built here (its binary would not fit in the carry beside FlashInfer's wheels)
( nvcc -O3 -std=c++17 -arch=sm_90 -I plugins -o /tmp/decode16_tiles benchmarks/cuda/decode16_tiles.cu \
    plugins/gatedDeltaRulePlugin/gatedDeltaRuleKernels.cu > "$out/tiles_build.log" 2>&1 ) &
build_pid=$!
step plugins 190 bash plugins/tests/runOnDevice.sh "$out/plugins" 90 "$PWD/.carry/tensorrt/include"
step cuda16 220 python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/cuda/test_state_dtype_cuda.py
wait $build_pid
step tiles 60 /tmp/decode16_tiles
step triton 130 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/kernels/test_gated_delta_rule_kernels.py \
  tests/kernels/test_attention_decode.py tests/ops/test_attention_cuda.py
tail -14 "$out/tiles.log"
grep -E "FAIL|Error" "$out"/cuda16.log "$out"/triton.log | head -10
printf '%s\n' "${sum[@]}"
