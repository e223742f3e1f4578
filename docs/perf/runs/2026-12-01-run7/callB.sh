#!/usr/bin/env bash
# Run 7, device call B (H200): the 16-bit decode kernel staged in shared memory (CUDA) checked
# (state-dtype tests incl. every head-size edge, decode tests) and timed (state_dtype_bench.py), the
# public op's host overhead (op_overhead.py, FLA beside), the Triton GPU grid with each failure's
# name, the in-place / CUDA-graph runner tests. Stages the first half of the FlashInfer wheels in
# /tmp/fi for call C. Results in $OUT/b.tgz; a summary last.
set -u
out=$OUT/b; mkdir -p "$out" /tmp/fi; cp .carry/fi1/* /tmp/fi/ 2>/dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$out/fla_install.log" 2>&1
export PYTHONPATH=$PWD:$PWD/kernels:/tmp/site PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-10s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E ' passed| failed|copy bandwidth' "$out/$n.log" | tail -1 | cut -c1-110)")"); }
PT="python3 -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short"
step cuda 200 $PT tests/cuda/test_state_dtype_cuda.py tests/cuda/test_gated_delta_rule_cuda.py -k "state_dtype or T1 or inplace or head_sizes or varlen"
step state 90 python3 benchmarks/state_dtype_bench.py --out-dir "$out/state"
step overhead 60 python3 benchmarks/op_overhead.py --out "$out/overhead"
step runtime 60 $PT tests/runtime/test_cuda_graph.py tests/kernels/test_gated_delta_rule_inplace.py
step triton 200 python3 -m pytest -v -m gpu -p no:cacheprovider --tb=line -n 12 tests/kernels/test_gpu_kernels.py tests/kernels/test_gpu_moe_kernels.py tests/kernels/test_state_dtype_gpu.py
grep -hE "FAILED|Error" "$out"/triton.log | grep -v "^FAILED tests.*- " | cut -c1-200 | sort | uniq | head -12
grep -hE "^FAILED|^E " "$out"/cuda.log "$out"/runtime.log | cut -c1-200 | head -12
grep -E "^\| (64|128|512) \|" "$out/state/state_dtype_bench.md" 2>/dev/null
tail -n 12 "$out/overhead/op_overhead.md" 2>/dev/null
cd "$out" && tar czf ../b.tgz . && cd .. && rm -rf b
printf '%s\n' "${sum[@]}"
