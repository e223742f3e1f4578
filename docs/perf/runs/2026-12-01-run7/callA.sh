#!/usr/bin/env bash
# Run 7, device call A (H200): which Triton GPU kernel tests fail (names), then where a decode
# step's time goes on the 1.66B-class model (benchmarks/decode_profile.py: eager-graph vs
# torch.compile, batch 1 and 32), then gdn-export bench with --compile. Results in $OUT/a.tgz.
set -u
out=$OUT/a; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-12s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E ' passed| failed|wall ' "$out/$n.log" | tail -1 | cut -c1-120)")"); }
step tk 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rf --tb=line -n 12 tests/kernels
CK=/tmp/ck16; python3 benchmarks/make_random_checkpoint.py $CK --size 1.6b --device cuda > "$out/make.log" 2>&1
step prof_b1 70 python3 benchmarks/decode_profile.py $CK --batch 1 --out "$out/prof_b1"
step prof_b32 70 python3 benchmarks/decode_profile.py $CK --batch 32 --out "$out/prof_b32"
step prof_b1_c 150 python3 benchmarks/decode_profile.py $CK --batch 1 --compile --out "$out/prof_b1_c"
step bench_b32_c 150 python3 -m gdn_export bench $CK --device cuda --dtype bf16 --prompt-len 4096 --decode-steps 32 --warmup 1 --repeats 3 --batch 32 --op-backend triton --compile --json "$out/bench_b32_c.json"
grep -E "^FAILED" "$out"/tk.log | cut -c1-220 | head -40
tail -n 22 "$out"/prof_b1_c/decode_profile.md 2>/dev/null
cd "$out" && tar czf ../a.tgz . && cd .. && rm -rf a
printf '%s\n' "${sum[@]}"
