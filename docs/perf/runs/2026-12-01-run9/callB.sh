#!/usr/bin/env bash
# Run 9, device call B (right after A, warm machine): gdn-export bench at batch 32 on the 1.66B-class model
# (compiled, triton ops); the 9B-class model at batch 1; the Triton decode kernel's launch configurations.
set -u
out=$OUT/b; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels:/tmp/site PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|FAIL|gdn-export \|' "$out/$n.log" | tail -1 | cut -c1-100)")"); }
P="--device cuda --dtype bf16 --prompt-len 4096 --decode-steps 32 --warmup 1 --repeats 3 --op-backend triton --compile"
step b32 110 python3 -m gdn_export bench /tmp/ck16 $P --batch 32 --json "$out/bench_b32.json"
rm -rf /tmp/ck16
CK9=/tmp/ck9; timeout 100 python3 benchmarks/make_random_checkpoint.py $CK9 --size 9b --device cuda > "$out/make9.log" 2>&1
step b1_9b 130 python3 -m gdn_export bench $CK9 $P --batch 1 --json "$out/bench_9b_b1.json"
step tsweep 100 python3 benchmarks/triton_decode_sweep.py --out-dir "$out/tsweep"
tail -n 4 "$out/b32.log" "$out/b1_9b.log"
grep -E "^\| (fp32|bf16) \|" "$out/tsweep.log" | head -30
printf '%s\n' "${sum[@]}"
