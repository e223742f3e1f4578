#!/usr/bin/env bash
# Run 11, device call B: the K/V caches written by one mutating custom op (gdn::write_kv_cache_, the
# gdn_kernels.kv_cache_write Triton kernel), which torch.compile keeps in place where the compiled
# scatter_ copied each whole cache twice per step (call A's batch-32 profile): its tests on the GPU,
# the batch-32 and batch-1 benches, a batch-32 decode profile.
set -u
out=$OUT/b; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|gdn-export \||wall' "$out/$n.log" | tail -1 | cut -c1-110)")"); }
CK=/tmp/ck16; timeout 60 python3 benchmarks/make_random_checkpoint.py $CK --size 1.6b --device cuda > "$out/make.log" 2>&1 &
step tests 100 python3 -m pytest -v -rf -p no:cacheprovider -n 8 -W ignore tests/kernels/test_kv_cache_write.py \
  tests/ops/test_kv_cache_write.py tests/runtime/test_cuda_graph.py tests/ops/test_attention_cuda.py
wait
B="python3 -m gdn_export bench $CK --device cuda --dtype bf16 --prompt-len 4096 --decode-steps 32 --warmup 1 --repeats 3 --op-backend triton --compile"
step b32 110 $B --batch 32 --json "$out/bench_b32.json"
step b1 80 $B --batch 1 --json "$out/bench_b1.json"
step prof32 130 python3 benchmarks/decode_profile.py $CK --batch 32 --compile --steps 8 --prompt-len 4096 --out "$out/prof32"
grep -E "^FAILED|Error" "$out/tests.log" | head -8
grep -E "^\| " "$out/prof32/decode_profile.md" 2>/dev/null | head -24
for f in b32 b1; do grep -E "^\| gdn|by phase" "$out/$f.log"; done
printf '%s\n' "${sum[@]}"
