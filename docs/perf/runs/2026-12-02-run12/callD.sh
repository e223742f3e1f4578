#!/usr/bin/env bash
# Run 12, device call D: every prefill shape class of issue 13 through the public op, ours (triton,
# cuda with the mma.sync walk) beside FLA 0.6, batched and packed.
set -u
out=$OUT/d; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > "$out/pip.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD:$PWD/kernels PYTHONUNBUFFERED=1
timeout 520 python3 benchmarks/prefill_pack_bench.py --no-flashinfer --out-dir "$out" --backends triton,cuda > "$out/pack.log" 2>&1
echo "rc=$?"
grep -E "^\| " "$out/prefill_pack_bench.md" 2>/dev/null || grep -E ": triton" "$out/pack.log"
