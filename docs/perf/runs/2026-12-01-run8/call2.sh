#!/usr/bin/env bash
# Run 8, device call 2: the 16-bit decode kernel made persistent with a prefetched second state buffer:
# grid variants (one block per tile / all that fit / balanced) at tile widths 64, 32, 16, states rotated.
set -u
out=$OUT/c2; mkdir -p "$out"
.carry/bin/decode16_tiles > "$out/tiles_rotated.log" 2>&1; echo "tiles rc=$?"
grep -E "check|per SM" "$out/tiles_rotated.log"
tail -14 "$out/tiles_rotated.log"
