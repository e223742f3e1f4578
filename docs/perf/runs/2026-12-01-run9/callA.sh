#!/usr/bin/env bash
# Run 9, device call A: gdn-export bench on the 1.66B-class model (prompt 4096, batch 1, compiled, triton
# ops) with the Triton prefill attention kernel, transformers + FLA 0.6.0 beside it and the accuracy mode;
# prefill attention alone (Triton kernel vs SDPA route vs flash on the new keys); its GPU tests; a
# profile of the compiled 4096-token prefill; the varlen prefill's host-side table (run 8 call 7's script).
set -u
out=$OUT/a; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:$PWD/kernels:/tmp/site PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|FAIL|gdn-export \|' "$out/$n.log" | tail -1 | cut -c1-100)")"); }
CK=/tmp/ck16; timeout 60 python3 benchmarks/make_random_checkpoint.py $CK --size 1.6b --device cuda > "$out/make.log" 2>&1
step b1hf 290 python3 -m gdn_export bench $CK --device cuda --dtype bf16 --prompt-len 4096 --decode-steps 32 \
  --warmup 1 --repeats 3 --op-backend triton --compile --batch 1 --compare-hf --accuracy --json "$out/bench_b1_hf.json"
step attnpf 60 python3 benchmarks/attention_prefill_bench.py --out-dir "$out/attnpf"
step tests 50 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/kernels/test_attention_prefill.py
step prof_pf 100 python3 benchmarks/decode_profile.py $CK --prefill --compile --prompt-len 4096 --steps 2 --out "$out/prof_pf"
step varlen 35 python3 benchmarks/results/2026-12-01-run8/call7_varlen_kernels.py
tail -n 12 "$out/b1hf.log"
tail -8 "$out/attnpf.log"
tail -3 "$out/varlen.log"
grep -E "^\| " "$out/prof_pf/decode_profile.md" 2>/dev/null | head -16
printf '%s\n' "${sum[@]}"
