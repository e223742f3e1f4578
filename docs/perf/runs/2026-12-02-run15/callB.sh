#!/usr/bin/env bash
# Run 15, device call B: the split walk (two warps share 16 state columns, half of dk each; the
# launcher takes it where 4-warp blocks of 64 columns cover at most half the multiprocessors) on top
# of call A's prepare kernel. The walk tests (new: the unpinned path on small grids and ragged packs
# against the reference and the unsplit walk), the cuda grid, the plugin host test with
# compute-sanitizer beside them; per-kernel profile; the public op beside FLA 0.6.
set -u
out=$OUT/b; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$out/pip.log" 2>&1
export PYTHONPATH=$PWD:$PWD/kernels:$PWD/benchmarks:/tmp/site PYTHONUNBUFFERED=1
( plugins/tests/runOnDevice.sh /tmp/plugins 90 "$PWD/.carry/tensorrt/include" > "$out/plugins.log" 2>&1 ) &
pp=$!
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|error' "$out/$n.log" | tail -1 | cut -c1-100)")"); }
step walk 300 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_chunk_walk_cuda.py tests/cuda/test_gated_delta_rule_cuda.py tests/cuda/test_gated_delta_rule_padding_cuda.py
wait $pp
step profile 60 python3 benchmarks/cuda_prefill_profile.py --out-dir /tmp/profile --calls 5
cp /tmp/profile/cuda_prefill_profile.md "$out/"
step pack 200 python3 benchmarks/prefill_pack_bench.py --no-flashinfer --backends triton,cuda --out-dir /tmp/pack
cp /tmp/pack/prefill_pack_bench.md /tmp/pack/prefill_pack_bench.json "$out/" 2>/dev/null
grep -hE "FAILED|Error" "$out"/walk.log | head -8
tail -7 "$out/plugins.log"; cp /tmp/plugins/host_test.md "$out/" 2>/dev/null
grep -E "auto|walk4 " "$out/cuda_prefill_profile.md" | cut -c1-160
grep -E "^\| " "$out/prefill_pack_bench.md" 2>/dev/null || tail -5 "$out/pack.log"
printf '%s\n' "${sum[@]}"
