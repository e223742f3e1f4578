#!/usr/bin/env bash
# Run 11, device call C: the batch-1 bench compiled with --compile-mode max-autotune (inductor times
# its Triton GEMM templates against cuBLAS per shape: the decode GEMVs ran at ~55-78% of the copy
# bandwidth); meanwhile the cuda extension builds; then the 16-bit-state decode launcher's new tile
# choice (2 warps a tile beyond tiny grids): its CUDA tests and the tile harness (prebuilt).
set -u
out=$OUT/c; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|gdn-export \||wall' "$out/$n.log" | tail -1 | cut -c1-110)")"); }
CK=/tmp/ck16; timeout 60 python3 benchmarks/make_random_checkpoint.py $CK --size 1.6b --device cuda > "$out/make.log" 2>&1
timeout 280 python3 -c "from gdn_export.cuda import backend; backend.load()" > "$out/ext.log" 2>&1 &
B="python3 -m gdn_export bench $CK --device cuda --dtype bf16 --prompt-len 4096 --decode-steps 32 --warmup 1 --repeats 3 --op-backend triton"
step b1mat 300 $B --batch 1 --compile-mode max-autotune --json "$out/bench_b1_mat.json"
wait
step tests 100 python3 -m pytest -v -rf -p no:cacheprovider -n 8 -W ignore tests/cuda/test_state_dtype_cuda.py
step tiles 60 .carry/bin/decode16_tiles --only launcher,bv64,bv64w2,bv32w2
grep -E "^FAILED|Error" "$out/tests.log" | head -8
tail -14 "$out/tiles.log"
grep -E "^\| gdn|by phase" "$out/b1mat.log"
printf '%s\n' "${sum[@]}"
