#!/usr/bin/env bash
# Run 13, device call D: the prefill through the public op beside FLA 0.6 on the classes whose walk
# now runs single-buffered (grids over one wave of double-buffered blocks: 8 x 8K at Hv 48 and 16,
# the ragged pack), and 1 x 16K (double-buffered, unchanged) for reference.
set -u
out=$OUT/d; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$out/pip.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD:$PWD/kernels PYTHONUNBUFFERED=1
timeout 560 python3 benchmarks/prefill_pack_bench.py --no-flashinfer --cases 1,3,4,7 --out-dir "$out" \
  --backends triton,cuda > "$out/pack.log" 2>&1
echo "rc=$?"
grep -E "^\| " "$out/prefill_pack_bench.md" 2>/dev/null || tail -12 "$out/pack.log"
