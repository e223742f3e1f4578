#!/usr/bin/env bash
# Run 13, device call B: the extension returns its problems instead of raising (call A: a raised
# check still ended the process with a segmentation fault), the op's fast entries on top of that,
# the walk's buffering chosen by grid size; GPU tests, the op's host overhead, the prefill's
# per-kernel profile, and beside them the plugin host test with compute-sanitizer memcheck and
# racecheck (its cases now include a grid of 384 walk blocks: the single-buffered walk).
set -u
out=$OUT/b; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$out/pip.log" 2>&1
export PYTHONUNBUFFERED=1
( PYTHONPATH=$PWD:$PWD/kernels plugins/tests/runOnDevice.sh "$out/plugins" 90 "$PWD/.carry/tensorrt/include" > "$out/plugins.log" 2>&1 ) &
export PYTHONPATH=/tmp/site:$PWD:$PWD/kernels
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|error' "$out/$n.log" | tail -1 | cut -c1-110)")"); }
step problems 200 python3 -m pytest -x -q -rf -p no:cacheprovider tests/cuda/test_gated_delta_rule_cuda.py -k test_extension_names_problems
step fast 60 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_op_fast_entry_cuda.py
step walk 100 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_chunk_walk_cuda.py
step ovh 60 python3 benchmarks/op_overhead.py --out "$out"
step prof 40 python3 benchmarks/cuda_prefill_profile.py --out-dir "$out"
step grid 200 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_gated_delta_rule_cuda.py tests/cuda/test_state_dtype_cuda.py tests/cuda/test_backend_validation.py
wait
grep -E "^\| (cuda|triton|FLA)" "$out/op_overhead.md" 2>/dev/null
grep -E "^\| " "$out/cuda_prefill_profile.md" 2>/dev/null | grep -E "auto|@99" | cut -c1-150
grep -hE "FAILED|Error|Segmentation" "$out"/{problems,fast,walk,grid}.log 2>/dev/null | head -12
tail -8 "$out/plugins.log"
printf '%s\n' "${sum[@]}"
