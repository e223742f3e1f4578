#!/usr/bin/env bash
# Run 12, device call B: the walk with cheaper chunk loads (TileRows) and 4 warps by default: its GPU
# tests, the per-kernel profile, then the prefill bench beside FLA 0.6 (quick cases: its autotuning
# takes minutes per shape).
set -u
out=$OUT/b; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$out/pip.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD:$PWD/kernels PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|error' "$out/$n.log" | tail -1 | cut -c1-110)")"); }
step walk 200 python3 -m pytest -x -q -rf -p no:cacheprovider tests/cuda/test_chunk_walk_cuda.py
step prof 40 python3 benchmarks/cuda_prefill_profile.py --out-dir "$out"
step pack 330 python3 benchmarks/prefill_pack_bench.py --no-flashinfer --quick --out-dir "$out" \
  --backends triton,cuda,cuda-wmma
grep -E "^\| " "$out/cuda_prefill_profile.md" 2>/dev/null
grep -E "^\| " "$out/prefill_pack_bench.md" 2>/dev/null || grep -E "^[0-9a-z].*:" "$out/pack.log" | tail -5
grep -E "FAILED|Error" "$out/walk.log" | head -8
printf '%s\n' "${sum[@]}"
