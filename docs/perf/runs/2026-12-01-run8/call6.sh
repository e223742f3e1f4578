#!/usr/bin/env bash
# Run 8, device call 6: decode16 with more blocks per multiprocessor (register caps 10 and 12 per SM);
# prefill packs vs batches after removing the Triton backend's host synchronisations (triton, FLA);
# gdn-export bench at batch 1, 4096 context, compiled, with transformers + FLA beside it and the
# accuracy mode (split-KV decode attention in).
set -u
out=$OUT/c6; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:$PWD/kernels:/tmp/site PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'gdn-export \||failed' "$out/$n.log" | tail -1 | cut -c1-110)")"); }
step tiles 60 .carry/bin/decode16_tiles
step pack 130 python3 benchmarks/prefill_pack_bench.py --quick --no-flashinfer --backends triton --out-dir "$out/pack"
CK=/tmp/ck16; timeout 90 python3 benchmarks/make_random_checkpoint.py $CK --size 1.6b --device cuda > "$out/make.log" 2>&1
step b1hf 200 python3 -m gdn_export bench $CK --device cuda --dtype bf16 --prompt-len 4096 --decode-steps 32 \
  --warmup 1 --repeats 3 --op-backend triton --compile --batch 1 --compare-hf --accuracy --json "$out/bench_b1_hf.json"
tail -16 "$out/tiles.log"
grep -E "^1 x|^ragged|^8 x" "$out/pack.log"
tail -n 8 "$out/b1hf.log"
printf '%s\n' "${sum[@]}"
