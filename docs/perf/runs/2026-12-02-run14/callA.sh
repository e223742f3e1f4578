#!/usr/bin/env bash
# Run 14, device call A: where the CUDA kernels' time goes, read from the hardware counters.
# Nsight Compute on the prepare and walk kernels (1 x 16K Hv 32, 8 x 8K Hv 48) and the 16-bit-state
# decode kernel (B = 64), source lines by stall samples (benchmarks/ncu_hotspots.py); beside it the
# decode harness with two floors for the bytes a step moves (the decode grid copying its tiles in
# place, and a plain device copy). (ncu_hotspots.py has since become ncu_summary.py: its source-line table
# did not parse ncu's per-file CSV; hot_*.md hold the headline metrics only.)
set -u
out=$OUT/a; mkdir -p "$out"
export PYTHONPATH=$PWD:$PWD/kernels:$PWD/benchmarks PYTHONUNBUFFERED=1
( nvcc -O3 -std=c++17 -arch=sm_90 -I plugins -o /tmp/decode16_tiles benchmarks/cuda/decode16_tiles.cu \
    plugins/gatedDeltaRulePlugin/gatedDeltaRuleKernels.cu > "$out/tiles_build.log" 2>&1 ) &
bp=$!
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss' "$n" "$rc" "$((SECONDS-t))")"); }
step build 240 python3 benchmarks/kernel_targets.py decode-b64
N="ncu --clock-control none --set full --import-source yes"
step n16k 150 $N -k regex:"Prepare|ChunkWalk" --launch-skip 2 --launch-count 2 -o /tmp/p16k python3 benchmarks/kernel_targets.py prefill-16k
step n8x8k 120 $N -k regex:Prepare --launch-skip 1 --launch-count 1 -o /tmp/p8x8k python3 benchmarks/kernel_targets.py prefill-8x8k
step ndec 60 $N -k regex:Decode16 --launch-skip 1 --launch-count 1 -o /tmp/dec python3 benchmarks/kernel_targets.py decode-b64
for r in p16k p8x8k dec; do timeout 60 python3 benchmarks/ncu_hotspots.py /tmp/$r.ncu-rep --top 40 > "$out/hot_$r.md" 2>&1; done
wait $bp
step tiles 90 /tmp/decode16_tiles --only launcher,bv64w2,bv64,copytile,memcpy
tail -16 "$out/tiles.log"
for r in p16k p8x8k dec; do echo "== $r"; head -24 "$out/hot_$r.md" | cut -c1-160; done
tail -3 "$out"/n16k.log "$out"/build.log
printf '%s\n' "${sum[@]}"
