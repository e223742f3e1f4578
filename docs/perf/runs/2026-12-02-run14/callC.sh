#!/usr/bin/env bash
# Run 14, device call C: the decode tiles with the tensor-core reduction, by warps a block and
# register caps (blocks resident a multiprocessor), beside the grid's copy floor; each tile checked
# against the float64 reference first.
set -u
out=$OUT/c; mkdir -p "$out"
nvcc -O3 -std=c++17 -arch=sm_90 -I plugins -o /tmp/decode16_tiles benchmarks/cuda/decode16_tiles.cu \
    plugins/gatedDeltaRulePlugin/gatedDeltaRuleKernels.cu > "$out/tiles_build.log" 2>&1 || tail -5 "$out/tiles_build.log"
timeout 120 /tmp/decode16_tiles --only launcher,bv64,bv64w4m8,bv64w4m10,bv64w2,bv64w2m11,bv64w8m5,bv32,bv32w2,bv32w4m12,copytile > "$out/tiles.log" 2>&1
echo "rc=$?"; grep -E "^check|^\|" "$out/tiles.log"
