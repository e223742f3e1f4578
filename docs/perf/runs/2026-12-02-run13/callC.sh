#!/usr/bin/env bash
# Run 13, device call C: call B again after two mends: the extension's problem messages are built
# without c10's operator<< (call B: formatting a shape ended the process with a segmentation fault,
# nothing thrown), and the 1- / 2-warp walks are single-buffered only (call B's plugin build ran past
# its 150 s; the build step now gets 300 s). GPU tests, op host overhead, prefill profile, and beside
# them the plugin host test with compute-sanitizer memcheck / racecheck.
set -u
out=$OUT/c; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$out/pip.log" 2>&1
export PYTHONUNBUFFERED=1
( PYTHONPATH=$PWD:$PWD/kernels plugins/tests/runOnDevice.sh "$out/plugins" 90 "$PWD/.carry/tensorrt/include" > "$out/plugins.log" 2>&1 ) &
export PYTHONPATH=/tmp/site:$PWD:$PWD/kernels
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|error' "$out/$n.log" | tail -1 | cut -c1-110)")"); }
step problems 240 python3 -m pytest -x -q -rf -p no:cacheprovider tests/cuda/test_gated_delta_rule_cuda.py -k test_extension_names_problems
step fast 60 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_op_fast_entry_cuda.py
step walk 100 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_chunk_walk_cuda.py
step ovh 60 python3 benchmarks/op_overhead.py --out "$out"
step prof 40 python3 benchmarks/cuda_prefill_profile.py --out-dir "$out"
step grid 240 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_gated_delta_rule_cuda.py tests/cuda/test_state_dtype_cuda.py tests/cuda/test_backend_validation.py
wait
grep -E "^\| (cuda|triton|FLA)" "$out/op_overhead.md" 2>/dev/null
grep -E "^\| " "$out/cuda_prefill_profile.md" 2>/dev/null | cut -c1-150
grep -hE "FAILED|Error|Segmentation" "$out"/{problems,fast,walk,grid}.log 2>/dev/null | head -12
tail -8 "$out/plugins.log"
printf '%s\n' "${sum[@]}"
