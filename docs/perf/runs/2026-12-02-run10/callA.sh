#!/usr/bin/env bash
# Run 10, device call A: the token-strided Triton kernels and the shared online-softmax helper on the
# GPU (written on the CPU in session 7), then the 1.66B-class bench at batch 1 (compiled, triton ops)
# for the prefill with the strided inputs and the peak memory, and a profile of a compiled decode step.
set -u
out=$OUT/a; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:$PWD/kernels:/tmp/site PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|FAIL|gdn-export \|' "$out/$n.log" | tail -1 | cut -c1-100)")"); }
CK=/tmp/ck16; timeout 60 python3 benchmarks/make_random_checkpoint.py $CK --size 1.6b --device cuda > "$out/make.log" 2>&1 &
step tests 170 python3 -m pytest -q -p no:cacheprovider -rf -x tests/kernels/test_token_strided_inputs.py \
  tests/kernels/test_attention_prefill.py tests/kernels/test_attention_decode.py tests/ops/test_attention_cuda.py \
  tests/kernels/test_causal_conv1d_kernels.py tests/kernels/test_gated_delta_rule_inplace.py
wait
step b1 150 python3 -m gdn_export bench $CK --device cuda --dtype bf16 --prompt-len 4096 --decode-steps 32 \
  --warmup 1 --repeats 5 --op-backend triton --compile --batch 1 --json "$out/bench_b1.json"
step prof_dec 100 python3 benchmarks/decode_profile.py $CK --compile --steps 8 --out "$out/prof_dec"
tail -n 12 "$out/b1.log"
grep -E "^\| " "$out/prof_dec/decode_profile.md" 2>/dev/null | head -24
printf '%s\n' "${sum[@]}"
