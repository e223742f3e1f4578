#!/usr/bin/env bash
# Run 8, device call 1: tile choices of the 16-bit-state decode kernel (benchmarks/cuda/decode16_tiles.cu,
# built here for sm_90 and carried as .carry/bin/decode16_tiles), states rotated past L2 and not; then the
# plugin host test with compute-sanitizer memcheck / racecheck on the staged decode kernel.
set -u
out=$OUT/c1; mkdir -p "$out"
.carry/bin/decode16_tiles > "$out/tiles_rotated.log" 2>&1; echo "tiles rc=$?"
.carry/bin/decode16_tiles --no-rotate > "$out/tiles_fixed.log" 2>&1; echo "tiles fixed rc=$?"
bash plugins/tests/runOnDevice.sh "$out/plugins" 90 "$PWD/.carry/tensorrt/include" > "$out/plugins.log" 2>&1; echo "plugins rc=$?"
tail -12 "$out/plugins.log"
grep check "$out/tiles_rotated.log"
tail -14 "$out/tiles_fixed.log"
tail -14 "$out/tiles_rotated.log"
