#!/usr/bin/env bash
# Run 7, device call D (H200): the Triton 16-bit-state and MoE GPU tests that failed under xdist in
# call B, serially with tracebacks; the state-dtype drift of the 1.66B-class model (2000 teacher-
# forced decode steps after 4096- and 16384-token prompts, cuda backend); the op overhead again with
# the wrapper's host pieces apart. Results in $OUT/d.tgz; a summary last.
set -u
out=$OUT/d; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:$PWD/kernels:/tmp/site PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-10s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E ' passed| failed|run:' "$out/$n.log" | tail -1 | cut -c1-110)")"); }
step tstate 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short tests/kernels/test_state_dtype_gpu.py "tests/kernels/test_gpu_moe_kernels.py::test_triton_moe_gpu"
step drift 200 python3 benchmarks/state_dtype_drift.py --large --backend cuda --prompt 4096 16384 --steps 2000 --out-dir "$out/drift"
step overhead 50 python3 benchmarks/op_overhead.py --out "$out/overhead"
grep -E "^(FAILED|E  )" "$out/tstate.log" | cut -c1-220 | head -30
tail -n 24 "$out/drift/state_dtype_drift_large.md" 2>/dev/null; tail -5 "$out/drift.log"
tail -n 14 "$out/overhead/op_overhead.md" 2>/dev/null
cd "$out" && tar czf ../d.tgz . && cd .. && rm -rf d
printf '%s\n' "${sum[@]}"
