#!/usr/bin/env bash
# Run 10, device call D: the compiled runner with the K/V caches written in place under torch.compile
# (gdn_export.ops.backends.exporting: torch 2.11's dynamo folded torch.compiler.is_exporting() to
# True, so call C's compiled runs copied every cache per call); the 1.66B-class bench at batch 32
# and 1, peaks by phase; the GPU kernel tests, stopping at the first failure.
set -u
out=$OUT/d; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|gdn-export \|' "$out/$n.log" | tail -1 | cut -c1-110)")"); }
CK=/tmp/ck16; timeout 60 python3 benchmarks/make_random_checkpoint.py $CK --size 1.6b --device cuda > "$out/make.log" 2>&1 &
step tests 90 python3 -m pytest -q -p no:cacheprovider -rf -n 8 -x -m gpu -W ignore tests/kernels/test_token_strided_inputs.py \
  tests/kernels/test_attention_prefill.py tests/ops/test_attention_cuda.py
wait
B="python3 -m gdn_export bench $CK --device cuda --dtype bf16 --prompt-len 4096 --decode-steps 32 --warmup 1 --repeats 3 --op-backend triton --compile"
step b32 110 $B --batch 32 --json "$out/bench_b32.json"
step b1 80 $B --batch 1 --json "$out/bench_b1.json"
grep -E "^FAILED|Error|assert" "$out/tests.log" | head -8
for f in b32 b1; do grep -E "^\| gdn|by phase" "$out/$f.log"; done
printf '%s\n' "${sum[@]}"
