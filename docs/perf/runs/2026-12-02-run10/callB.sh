#!/usr/bin/env bash
# Run 10, device call B: the 16-bit-state decode harness with the warp-tile kernel
# (gatedDeltaRuleDecodeWarpKernel: one warp per [Dk, 16 / 32 / 64] tile, no block barrier; built on
# the CPU machine into .carry/bin) beside the block-tile kernel; the GPU tests call A's -x stopped.
set -u
out=$OUT/b; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:$PWD/kernels:/tmp/site PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|FAIL' "$out/$n.log" | tail -1 | cut -c1-100)")"); }
step tiles 120 .carry/bin/decode16_tiles
step tests 240 python3 -m pytest -q -p no:cacheprovider -rf tests/kernels/test_token_strided_inputs.py \
  tests/kernels/test_attention_prefill.py tests/kernels/test_attention_decode.py tests/ops/test_attention_cuda.py \
  tests/kernels/test_causal_conv1d_kernels.py tests/kernels/test_gated_delta_rule_inplace.py
tail -16 "$out/tiles.log"
grep -E "^FAILED" "$out/tests.log" | head
printf '%s\n' "${sum[@]}"
