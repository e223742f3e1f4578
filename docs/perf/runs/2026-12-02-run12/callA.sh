#!/usr/bin/env bash
# Run 12, device call A: the mma.sync walk of the CUDA prefill (state in registers): its GPU tests
# (pinned widths vs the fp32 reference and each other, the wmma walk beside), the cuda kernel tests
# through the default path, the per-kernel profile of each walk, and the prefill bench of our
# backends side by side (FLA / FlashInfer in call B).
set -u
out=$OUT/a; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|error' "$out/$n.log" | tail -1 | cut -c1-110)")"); }
step walk 280 python3 -m pytest -x -q -rf -p no:cacheprovider tests/cuda/test_chunk_walk_cuda.py
step gdr 110 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_gated_delta_rule_cuda.py tests/cuda/test_state_dtype_cuda.py -k "not tile_widths"
step prof 60 python3 benchmarks/cuda_prefill_profile.py --out-dir "$out"
step pack 120 python3 benchmarks/prefill_pack_bench.py --no-fla --no-flashinfer --out-dir "$out" \
  --backends triton,cuda,cuda-wmma,cuda-walk2,cuda-walk4
grep -E "^\| " "$out/cuda_prefill_profile.md" 2>/dev/null
grep -E "^\| " "$out/prefill_pack_bench.md" 2>/dev/null
grep -E "FAILED|Error" "$out/walk.log" | head -8
printf '%s\n' "${sum[@]}"
