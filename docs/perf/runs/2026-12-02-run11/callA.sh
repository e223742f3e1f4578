#!/usr/bin/env bash
# Run 11, device call A: where a compiled batch-32 decode step goes (profile at 4096 context); the
# batch-1 bench with a 2048-token prefill chunk (peak vs prefill time); the 16-bit-state decode
# harness's 2-warp tiles beside the launcher's 4-warp ones (prebuilt in .carry/bin).
set -u
out=$OUT/a; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|gdn-export \||wall' "$out/$n.log" | tail -1 | cut -c1-110)")"); }
CK=/tmp/ck16; timeout 60 python3 benchmarks/make_random_checkpoint.py $CK --size 1.6b --device cuda > "$out/make.log" 2>&1 &
step tiles 90 .carry/bin/decode16_tiles --only launcher,bv64,bv64w2,bv32w2
wait
step prof32 150 python3 benchmarks/decode_profile.py $CK --batch 32 --compile --steps 8 --prompt-len 4096 --out "$out/prof32"
B="python3 -m gdn_export bench $CK --device cuda --dtype bf16 --prompt-len 4096 --decode-steps 32 --warmup 1 --repeats 3 --op-backend triton --compile"
step b1c2048 100 $B --batch 1 --prefill-chunk 2048 --json "$out/bench_b1_c2048.json"
tail -14 "$out/tiles.log"
grep -E "^\| " "$out/prof32/decode_profile.md" 2>/dev/null | head -30
grep -E "^\| gdn|by phase" "$out/b1c2048.log"
printf '%s\n' "${sum[@]}"
