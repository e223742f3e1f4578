#!/usr/bin/env bash
# Run 8, device call 3: why call 2's kernels were slower: the committed (run 7) kernel beside the new
# one with one and two state buffers, one block per tile and persistent, in one run (states rotated).
# Built with -DWITH_OLD_KERNEL and the run-7 kernel extracted to .carry/exp/old_decode16.cuh.
set -u
out=$OUT/c3; mkdir -p "$out"
.carry/bin/decode16_tiles > "$out/tiles_rotated.log" 2>&1; echo "tiles rc=$?"
grep -E "check|per SM|copy band" "$out/tiles_rotated.log"
tail -13 "$out/tiles_rotated.log"
