#!/usr/bin/env bash
# Run 14, device call D (call E follows at once; it reuses /tmp/fi and the extension built here):
# FlashInfer's first half staged in /tmp/fi; the final decode launcher (64 columns on 4 warps for
# large grids, the reduction on the tensor cores) under the 16-bit-state CUDA tests and the op's fast
# entries; the Triton varlen tests (cu_seqlens read once per tensor version, the vectorised chunk
# table) on the GPU; the plugin host test with compute-sanitizer memcheck / racecheck beside them.
set -u
out=$OUT/d; mkdir -p "$out" /tmp/fi; cp .carry/fi1/* /tmp/fi/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$out/pip.log" 2>&1
export PYTHONPATH=$PWD:$PWD/kernels:$PWD/benchmarks PYTHONUNBUFFERED=1
( plugins/tests/runOnDevice.sh "$out/plugins" 90 "$PWD/.carry/tensorrt/include" > "$out/plugins.log" 2>&1 ) &
pp=$!
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|error' "$out/$n.log" | tail -1 | cut -c1-100)")"); }
step state 300 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_state_dtype_cuda.py tests/cuda/test_op_fast_entry_cuda.py
step triton 200 python3 -m pytest -q -rf -p no:cacheprovider tests/kernels/test_gated_delta_rule_kernels.py
wait $pp
grep -hE "FAILED|Error" "$out"/state.log "$out"/triton.log | head -8
tail -6 "$out/plugins.log"
printf '%s\n' "${sum[@]}"
