#!/usr/bin/env bash
# Run 9, device call C (the session's last device seconds): the Triton kernels reading q / k / v and the
# conv's input as channel slices (token strides) instead of contiguous copies: their tests on the GPU,
# then gdn-export bench at batch 1 (compiled, triton ops, prompt 4096) for the prefill's time.
set -u
out=$OUT/c; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels PYTHONUNBUFFERED=1
timeout 45 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_token_strided_inputs.py > "$out/tests.log" 2>&1
tail -1 "$out/tests.log"
CK=/tmp/ck16; timeout 40 python3 benchmarks/make_random_checkpoint.py $CK --size 1.6b --device cuda > "$out/make.log" 2>&1
timeout 110 python3 -m gdn_export bench $CK --device cuda --dtype bf16 --prompt-len 4096 --decode-steps 32 \
  --warmup 1 --repeats 3 --op-backend triton --compile --batch 1 --json "$out/bench_b1.json" > "$out/b1.log" 2>&1
grep -E "run [0-9]|gdn-export \|" "$out/b1.log"
