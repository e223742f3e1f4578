#!/usr/bin/env bash
# Run 6, device call 4 (H200): the decode tile for 16-bit states (CUDA: 256 threads x 8 columns,
# BV = 64; Triton: BV = 64) checked (state-dtype and decode tests) and timed (state_dtype_bench.py,
# without FlashInfer: its wheels take two calls; call 3 timed it on the same GPU kind), then the whole
# Triton GPU grid with failures listed. Results in $OUT/d.tgz; a summary last.
set -u
out=$OUT/d; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-8s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E ' passed| failed|copy bandwidth' "$out/$n.log" | tail -1 | cut -c1-110)")"); }
PT="python3 -m pytest -q -m gpu -p no:cacheprovider -rf --tb=line"
step cuda 170 $PT tests/cuda/test_state_dtype_cuda.py tests/cuda/test_gated_delta_rule_cuda.py tests/kernels/test_state_dtype_gpu.py
step state 80 python3 benchmarks/state_dtype_bench.py --out-dir "$out/state"
step triton 230 $PT -n 16 tests/kernels
grep -E "^FAILED" "$out"/*.log | cut -c1-200 | head -20
tail -25 "$out/state/state_dtype_bench.md" 2>/dev/null
cd "$out" && tar czf ../d.tgz . && cd .. && rm -rf d
printf '%s\n' "${sum[@]}"
