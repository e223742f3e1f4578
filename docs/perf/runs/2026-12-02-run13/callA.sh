#!/usr/bin/env bash
# Run 13, device call A: (1) the extension's checks raise instead of crashing (the op's fast entries
# rely on them; run alone first); (2) GPU tests of the fast entries, of the chunked path under the
# shared memory of 99 KB / 163 KB GPUs (prepare kernel with Tk in q's bytes, single-buffered walk)
# and of the whole cuda grid; (3) the op's host overhead; (4) the prefill's per-kernel profile with
# the single-buffered walk.
set -u
out=$OUT/a; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$out/pip.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD:$PWD/kernels PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|error' "$out/$n.log" | tail -1 | cut -c1-110)")"); }
step check 200 python3 -m pytest -x -q -rf -p no:cacheprovider tests/cuda/test_gated_delta_rule_cuda.py -k test_extension_check_raises
if grep -q "1 passed" "$out/check.log"; then
  step fast 60 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_op_fast_entry_cuda.py
fi
step walk 200 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_chunk_walk_cuda.py
step ovh 60 python3 benchmarks/op_overhead.py --out "$out"
step prof 60 python3 benchmarks/cuda_prefill_profile.py --out-dir "$out"
step grid 150 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_gated_delta_rule_cuda.py tests/cuda/test_state_dtype_cuda.py
grep -E "^\| " "$out/op_overhead.md" 2>/dev/null
grep -E "^\| " "$out/cuda_prefill_profile.md" 2>/dev/null | cut -c1-150
grep -hE "FAILED|Error|Segmentation" "$out"/{check,fast,walk,grid}.log 2>/dev/null | head -12
printf '%s\n' "${sum[@]}"
