#!/usr/bin/env bash
# Run 15, device call A: the prepare kernel for 16-bit inputs on mma.sync (gatedDeltaRulePrepare16Kernel,
# gatedDeltaRuleChunkPrepare16.cuh). The CUDA prefill tests (chunked path against the fp32 reference:
# walk widths, grouped heads, ragged packs, odd lengths, small-GPU shared memory), the plugin host
# test with compute-sanitizer memcheck / racecheck beside them, then the per-kernel profile, the
# prepare kernel's counters and the public op on packs and batches (ours only; FLA in call B).
set -u
out=$OUT/a; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels:$PWD/benchmarks PYTHONUNBUFFERED=1
( plugins/tests/runOnDevice.sh "$out/plugins" 90 "$PWD/.carry/tensorrt/include" > "$out/plugins.log" 2>&1 ) &
pp=$!
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'passed|failed|error' "$out/$n.log" | tail -1 | cut -c1-100)")"); }
step walk 330 python3 -m pytest -q -rf -x -p no:cacheprovider tests/cuda/test_chunk_walk_cuda.py tests/cuda/test_gated_delta_rule_padding_cuda.py
wait $pp
step grid 200 python3 -m pytest -q -rf -p no:cacheprovider tests/cuda/test_gated_delta_rule_cuda.py
step profile 60 python3 benchmarks/cuda_prefill_profile.py --out-dir "$out/profile" --calls 5
step ncu 60 ncu --clock-control none --set full -k regex:Prepare --launch-skip 1 --launch-count 1 -o /tmp/p16k -f python3 benchmarks/kernel_targets.py prefill-16k
step ncusum 30 python3 benchmarks/ncu_summary.py /tmp/p16k.ncu-rep
step pack 120 python3 benchmarks/prefill_pack_bench.py --no-fla --no-flashinfer --backends triton,cuda --out-dir "$out/pack"
grep -hE "FAILED|Error" "$out"/walk.log "$out"/grid.log | head -8
tail -7 "$out/plugins.log"
grep -E "auto|@99" "$out/profile/cuda_prefill_profile.md" | cut -c1-160
tail -12 "$out/ncusum.log"
grep -E "^\| " "$out/pack/prefill_pack_bench.md" 2>/dev/null || tail -5 "$out/pack.log"
printf '%s\n' "${sum[@]}"
