#!/usr/bin/env bash
# Run 6, device call 2 (H200): GPU tests of what changed since run 5 (Triton state-dtype / MoE /
# in-place / padding kernels, the CUDA-graph runner, whole tiny models with a ragged row), the MoE
# benchmark, the plugin host test. Stages the first half of the FlashInfer wheels in /tmp/fi for
# call 3. Logs in $OUT/b; a summary last.
set -u
out=$OUT/b; mkdir -p "$out" /tmp/fi; cp .carry/fi1/* /tmp/fi/ 2>/dev/null
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-10s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|PASS|FAIL' "$out/$n.log" | tail -1 | cut -c1-100)")"); }
PT="python3 -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short"
step runtime 60 $PT tests/runtime/test_cuda_graph.py tests/ops/test_attention_cuda.py
step triton 170 $PT -n 12 tests/kernels/test_state_dtype_gpu.py tests/kernels/test_gpu_moe_kernels.py \
    tests/kernels/test_gated_delta_rule_inplace.py tests/kernels/test_gated_delta_rule_padding_kernels.py tests/kernels/test_gpu_kernels.py
step models 80 $PT tests/models/test_op_backends_gpu.py
step moe 110 python3 benchmarks/moe_bench.py --out "$out/moe"
step plugins 140 plugins/tests/runOnDevice.sh "$out/plugins" 90 "$PWD/.carry/tensorrt/include"
cp "$out"/moe/moe_bench.md "$out"/ 2>/dev/null; cd "$out" && tar czf ../b.tgz . && cd .. && rm -rf b
printf '%s\n' "${sum[@]}"
