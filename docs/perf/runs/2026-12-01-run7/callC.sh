#!/usr/bin/env bash
# Run 7, device call C (H200, right after call B): FlashInfer 0.7.2 from the wheels staged by call B
# plus .carry/fi2; the recurrent-state-dtype benchmark beside FlashInfer's bf16-state decode; then
# the 1.66B-class end to end with the fused projections: decode profile (torch.compile), gdn-export
# bench at batch 1 (transformers + FLA beside it, accuracy mode) and 32, a prefill profile.
set -u
out=$OUT/c; mkdir -p "$out" /tmp/fi; cp .carry/fi2/* /tmp/fi/ 2>/dev/null
( cd /tmp/fi && cat cu13.part.* > nvidia_cutlass_dsl_libs_cu13-4.7.1-cp312-cp312-manylinux_2_28_x86_64.whl \
  && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site ./*.whl ) > "$out/flashinfer_install.log" 2>&1
export PYTHONPATH=$PWD:$PWD/kernels:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
sum=()
step() { local n=$1 l=$2; shift 2; local t=$SECONDS; timeout "$l" "$@" > "$out/$n.log" 2>&1; local rc=$?
  sum+=("$(printf '%-10s rc=%-3s %4ss %s' "$n" "$rc" "$((SECONDS-t))" "$(grep -E 'copy bandwidth|wall |gdn-export \|' "$out/$n.log" | tail -1 | cut -c1-120)")"); }
step state 100 python3 benchmarks/state_dtype_bench.py --out-dir "$out/state"
CK=/tmp/ck16; [ -f $CK/config.json ] || python3 benchmarks/make_random_checkpoint.py $CK --size 1.6b --device cuda > "$out/make.log" 2>&1
B="python3 -m gdn_export bench $CK --device cuda --dtype bf16 --prompt-len 4096 --decode-steps 32 --warmup 1 --repeats 3 --op-backend triton"
step prof_b1_c 110 python3 benchmarks/decode_profile.py $CK --batch 1 --compile --out "$out/prof_b1_c"
step bench_b1_c 150 $B --batch 1 --compile --compare-hf --json "$out/bench_b1_c.json"
step bench_b32_c 120 $B --batch 32 --compile --json "$out/bench_b32_c.json"
step prof_pf 60 python3 benchmarks/decode_profile.py $CK --batch 1 --prefill --prompt-len 4096 --steps 3 --out "$out/prof_pf"
tail -3 "$out/flashinfer_install.log"
grep -E "^\| (1|64|128|512) \| bf16" "$out/state/state_dtype_bench.md" 2>/dev/null
head -16 "$out/prof_b1_c/decode_profile.md" 2>/dev/null; head -16 "$out/prof_pf/decode_profile.md" 2>/dev/null
tail -n 4 "$out"/bench_*.log
cd "$out" && tar czf ../c.tgz . && cd .. && rm -rf c
printf '%s\n' "${sum[@]}"
