#!/usr/bin/env bash
# Run 11, device call D: the decode projections on gdn_kernels.linear_small_m (a Triton matrix-vector
# kernel, no split-K) against cuBLAS: its tests, the projection bench (rotating weights past L2,
# with a launch sweep at M = 1), and the 1.66B-class bench at batch 1 and 32 with each.
set -u
out=$OUT/d; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|gdn-export \||wall' "$out/$n.log" | tail -1 | cut -c1-110)")"); }
CK=/tmp/ck16; timeout 60 python3 benchmarks/make_random_checkpoint.py $CK --size 1.6b --device cuda > "$out/make.log" 2>&1 &
step tests 80 python3 -m pytest -v -rf -p no:cacheprovider -n 8 -W ignore tests/kernels/test_linear_small_m.py \
  tests/modules/test_fused_linear.py "tests/runtime/test_cuda_graph.py::test_triton_decode_gemm_matches_cublas_bf16"
wait
step gemv 90 python3 benchmarks/linear_small_m_bench.py --out "$out/gemv" --sweep
B="python3 -m gdn_export bench $CK --device cuda --dtype bf16 --prompt-len 4096 --decode-steps 32 --warmup 1 --repeats 3 --op-backend triton --compile"
step b1tri 70 $B --batch 1 --decode-gemm triton --json "$out/bench_b1_triton.json"
step b1cub 70 $B --batch 1 --decode-gemm cublas --json "$out/bench_b1_cublas.json"
step b32tri 90 $B --batch 32 --decode-gemm triton --json "$out/bench_b32_triton.json"
grep -E "^FAILED|Error" "$out/tests.log" | head -8
grep -E "^\| " "$out/gemv/linear_small_m_bench.md" 2>/dev/null
grep -E "sweep" "$out/gemv.log" | cut -c1-250
for f in b1tri b1cub b32tri; do grep -E "^\| gdn" "$out/$f.log"; done
printf '%s\n' "${sum[@]}"
