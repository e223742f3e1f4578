#!/usr/bin/env bash
# Run 10, device call C: the GPU tests (token-strided Triton inputs, prefill attention, the whole model
# on the triton backend); the 1.66B-class bench at batch 32 and 1 with the peak memory split by phase
# (load / setup / prefill / decode); what is live at the prefill peak (benchmarks/peak_memory_probe.py).
set -u
out=$OUT/c; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:$PWD/kernels:/tmp/site PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|gdn-export \||live at its peak' "$out/$n.log" | tail -1 | cut -c1-110)")"); }
CK=/tmp/ck16; timeout 60 python3 benchmarks/make_random_checkpoint.py $CK --size 1.6b --device cuda > "$out/make.log" 2>&1 &
step tests 150 python3 -m pytest -q -p no:cacheprovider -rf -n 8 -m gpu tests/kernels/test_token_strided_inputs.py \
  tests/kernels/test_attention_prefill.py tests/ops/test_attention_cuda.py tests/models/test_op_backends_gpu.py
wait
B="python3 -m gdn_export bench $CK --device cuda --dtype bf16 --prompt-len 4096 --decode-steps 32 --warmup 1 --repeats 3 --op-backend triton --compile"
step b32 120 $B --batch 32 --json "$out/bench_b32.json"
step b1 90 $B --batch 1 --json "$out/bench_b1.json"
step probe32 80 python3 benchmarks/peak_memory_probe.py $CK --batch 32 --compile --out "$out/probe32"
step probe1 80 python3 benchmarks/peak_memory_probe.py $CK --batch 1 --compile --out "$out/probe1"
grep -E "^FAILED" "$out/tests.log" | head -5
tail -n 6 "$out/b32.log" | grep -v "^$"; tail -n 6 "$out/b1.log" | grep -v "^$"
for f in probe32 probe1; do grep -E "^weights|^\| " "$out/$f/peak_memory_probe.md" 2>/dev/null | head -9; done
printf '%s\n' "${sum[@]}"
