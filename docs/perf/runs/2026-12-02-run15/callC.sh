#!/usr/bin/env bash
# Run 15, device call C: the walk tests as mended after call B (call B: 8 failed, 488 passed; the
# failures were two test premises the split walk changed, not wrong results: an inequality to the
# unsplit walk that small head dims can meet exactly, and bit-equality under 163 KB to the unsplit
# walk where the split now fits), the launcher's choice read from the kernels launched, and the public
# op on every shape class (ours; FLA 0.6 timed in call B and run 13, its autotuning outlasts a call).
set -u
out=$OUT/c; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels:$PWD/benchmarks PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|error' "$out/$n.log" | tail -1 | cut -c1-100)")"); }
step walk 300 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_chunk_walk_cuda.py
step pack 150 python3 benchmarks/prefill_pack_bench.py --no-fla --no-flashinfer --backends triton,cuda --out-dir /tmp/pack
cp /tmp/pack/prefill_pack_bench.md /tmp/pack/prefill_pack_bench.json "$out/" 2>/dev/null
grep -hE "FAILED|Error" "$out"/walk.log | head -8
grep -E "^\| " "$out/prefill_pack_bench.md" 2>/dev/null || tail -5 "$out/pack.log"
printf '%s\n' "${sum[@]}"
