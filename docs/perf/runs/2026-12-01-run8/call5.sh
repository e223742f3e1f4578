#!/usr/bin/env bash
# Run 8, device call 5 (right after call 4, whose /tmp/fi and extension build it reuses): FlashInfer 0.7.2
# installed from /tmp/fi + .carry/fi2; the state-dtype decode bench (states rotated past L2) beside
# FlashInfer's bf16-state decode; prefill batches vs packs (ours, FLA, FlashInfer); the split-KV decode
# attention vs SDPA; gdn-export bench on the 1.66B-class model at 4096 context (b1, b32, compiled).
set -u
out=$OUT/c5; mkdir -p "$out" /tmp/fi; cp .carry/fi2/* /tmp/fi/ 2>/dev/null
( cd /tmp/fi && cat cu13.part.* > nvidia_cutlass_dsl_libs_cu13-4.7.1-cp312-cp312-manylinux_2_28_x86_64.whl \
  && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site ./*.whl ) > "$out/flashinfer_install.log" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >> "$out/flashinfer_install.log" 2>&1
export PYTHONPATH=$PWD:$PWD/kernels:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-9s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'gdn-export \||failed' "$out/$n.log" | tail -1 | cut -c1-110)")"); }
step state 130 python3 benchmarks/state_dtype_bench.py --out-dir "$out/state"
step attn 50 python3 benchmarks/attention_decode_bench.py --out-dir "$out/attn"
step pack 150 python3 benchmarks/prefill_pack_bench.py --quick --out-dir "$out/pack"
CK=/tmp/ck16; timeout 90 python3 benchmarks/make_random_checkpoint.py $CK --size 1.6b --device cuda > "$out/make.log" 2>&1
B="python3 -m gdn_export bench $CK --device cuda --dtype bf16 --prompt-len 4096 --decode-steps 32 --warmup 1 --repeats 3 --op-backend triton --compile"
step b1 110 $B --batch 1 --json "$out/bench_b1.json"
step b32 100 $B --batch 32 --json "$out/bench_b32.json"
tail -2 "$out/flashinfer_install.log"
grep -E "^\| (1|2|4|32|64|128|512) \| bf16" "$out/state/state_dtype_bench.md"
tail -n 14 "$out/attn/"*.md 2>/dev/null
tail -n 5 "$out/pack/prefill_pack_bench.md" 2>/dev/null
tail -n 2 "$out"/b1.log "$out"/b32.log
printf '%s\n' "${sum[@]}"
